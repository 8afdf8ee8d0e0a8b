package scripttest

import _ "embed"

// schemaJSON is the JSON Schema of the test files, for editors: yaml-language-server
// reads it from a first line "# yaml-language-server: $schema=PATH" or from its
// yaml.schemas setting. luaop stubs --schema FILE writes it.
//
//go:embed luaop-test.schema.json
var schemaJSON string

// Schema is the JSON Schema (draft-07) of the test files.
func Schema() string { return schemaJSON }

// SchemaModeline is the first line of a test file that makes yaml-language-server
// validate it against the schema at path (relative to the test file).
func SchemaModeline(path string) string { return "# yaml-language-server: $schema=" + path + "\n" }
