//go:build !linux

package scriptsource

import "io/fs"

// fileIdentity: without Linux's stat fields, FileCache reads every file.
type fileIdentity struct{ changed int64 }

func identityOf(fs.FileInfo) (fileIdentity, bool) { return fileIdentity{}, false }

func onLocalFileSystem(string) bool { return false }
