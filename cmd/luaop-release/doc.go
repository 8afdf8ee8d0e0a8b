// Command luaop-release finishes the artifacts of `make release` in dist/:
//
//	luaop-release sbom -in SBOM.json -out SBOM.json -gopher-lua DIR
//	luaop-release provenance -dist DIR -version V -platforms "linux/amd64 ..." -out FILE
//
// sbom adds to a CycloneDX SBOM made by cyclonedx-gomod the component it cannot see:
// gopher-lua, copied into luaop's own module as third_party/gopher-lua and patched
// (not a go.mod dependency, so no build information names it), under its upstream
// package URL and version, so that a scanner matching upstream's advisories finds it,
// with a pedigree saying it is patched and where the patches are listed.
//
// provenance writes an in-toto statement with a SLSA v1 provenance predicate for
// every artifact of dist/ (its SHA-256), the source's git commit and the build's
// parameters. It is not signed: signing needs a key or an identity this build does
// not have (a release pipeline signs it, with cosign for instance).
package main
