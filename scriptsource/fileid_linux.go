package scriptsource

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

// Magic numbers of the local file systems whose stat FileCache trusts (statfs(2)).
// Network and FUSE file systems may answer stat from a cache or take their times
// from a remote clock: their files are always read.
var localFileSystems = map[int64]bool{
	0xEF53:     true, // ext2, ext3, ext4
	0x58465342: true, // xfs
	0x9123683E: true, // btrfs
	0x01021994: true, // tmpfs (Secret volumes, /tmp)
	0x794C7630: true, // overlayfs (container root file systems)
	0x2FC12FC1: true, // zfs
	0x858458F6: true, // ramfs
}

// onLocalFileSystem tells whether dir is on a file system whose stat FileCache trusts.
func onLocalFileSystem(dir string) bool {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return false
	}
	return localFileSystems[int64(st.Type)]
}
