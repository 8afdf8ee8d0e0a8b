package luabind

import (
	"io/fs"
	"syscall"
)

// fileIdentity is what stat tells of a file that changes whenever its content may
// have: the change time moves on every write, rename or chmod and cannot be set.
type fileIdentity struct {
	dev, ino uint64
	size     int64
	// modified and changed are the modification and change times, in
	// nanoseconds since the epoch.
	modified, changed int64
}

func identityOf(fi fs.FileInfo) (fileIdentity, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileIdentity{}, false
	}
	return fileIdentity{
		dev: uint64(st.Dev), ino: st.Ino, size: st.Size,
		modified: st.Mtim.Nano(),
		changed:  st.Ctim.Nano(),
	}, true
}
