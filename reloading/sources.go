package reloading

import (
	"context"
	"strconv"

	"github.com/luaop/luaop/scriptsource"
	"github.com/luaop/luaop/scriptwatch"
)

// API is the scripts ConfigMap read through the API server, a second source of the
// scripts the folder is mounted from; *scriptwatch.ConfigMapSource is one.
type API interface {
	// Watch sends the ConfigMap's content: as first listed, then at every update,
	// until ctx is done (then it closes the channel).
	Watch(ctx context.Context) <-chan scriptwatch.Change
	// Get reads the ConfigMap as it is now.
	Get(ctx context.Context) (scriptwatch.Change, error)
	// Name is the ConfigMap, namespace/name, for messages.
	Name() string
}

// maxSeen bounds the contents remembered with their resourceVersion: a folder
// holding one forgotten is asked about (API.Get), not loaded blindly.
const maxSeen = 32

// versions orders the scripts by the ConfigMap's resourceVersion, not by arrival:
// the kubelet's copy (the folder) may arrive after the API's content, or lag
// behind a newer one, and must never replace newer scripts. A folder's content is
// placed by its hash: the resourceVersion at which the API had the same content.
//
// resourceVersions are compared as numbers (they are etcd's revisions, and the API
// server's watch cache compares them so too); one that is not a number is taken
// as newer than all before it (arrival order).
type versions struct {
	// live: a content came through the API, so the folder is the ConfigMap alone
	// and the API is followed.
	live bool
	// newest is the resourceVersion of the newest content read through the API.
	newest uint64
	// seen maps a content's hash to the newest resourceVersion it was read at.
	seen map[string]uint64
}

// note records a content read through the API and returns its resourceVersion.
func (v *versions) note(ch scriptwatch.Change) uint64 {
	rv, err := strconv.ParseUint(ch.ResourceVersion, 10, 64)
	if err != nil {
		rv = v.newest + 1
	}
	if v.seen == nil {
		v.seen = map[string]uint64{}
	}
	if len(v.seen) >= maxSeen {
		v.forgetOldest()
	}
	v.seen[ch.Hash] = max(v.seen[ch.Hash], rv)
	return rv
}

func (v *versions) forgetOldest() {
	oldest, at := "", uint64(0)
	for h, rv := range v.seen {
		if oldest == "" || rv < at {
			oldest, at = h, rv
		}
	}
	delete(v.seen, oldest)
}

// fromAPI decides on a content read through the API: whether to load it. The
// first one decides whether the API is followed at all: only when the folder is
// that ConfigMap alone, as the kubelet mounts it; else the folder stays the only
// source, and the watch is stopped.
func (r *Reloader) fromAPI(ch scriptwatch.Change) bool {
	if !r.versions.live {
		if why := scriptsource.NotAVolumeOf(r.opts.Dir, ch.Keys); why != "" {
			r.log.Warn("the scripts are read from the folder only: it is not the scripts ConfigMap alone, so its edits arrive with the kubelet (about a minute later)",
				"dir", r.opts.Dir, "configmap", r.opts.API.Name(), "why", why,
				"next", "mount the ConfigMap alone and whole (no items, no projected sources, no subPath) to have edits live as they are applied")
			r.stopAPI()
			r.api = nil
			return false
		}
		r.versions.live = true
		r.log.Info("the scripts follow the ConfigMap through the API", "configmap", r.opts.API.Name(), "resourceVersion", ch.ResourceVersion)
	}
	rv := r.versions.note(ch)
	if rv <= r.versions.newest {
		return false // not newer than a content already read (a relist, or the folder was first)
	}
	r.versions.newest = rv
	return ch.Hash != r.tried.Hash
}

// fromFolder decides on a change of the folder: the change to load, if any. Once
// the API is followed, the folder's content is placed by its hash among the
// contents the API had: the kubelet catching up (the scripts serving) loads
// nothing, an older content is not loaded over newer scripts, and one the API was
// not seen with is asked about (the folder may be ahead of the watch). fromAPI:
// the change to load is the ConfigMap's as the API answered, not the folder's.
func (r *Reloader) fromFolder(ctx context.Context, ch scriptwatch.Change) (load scriptwatch.Change, ok, fromAPI bool) {
	if ch.Hash == r.tried.Hash {
		r.log.Debug("the scripts folder caught up with the scripts serving", "dir", r.opts.Dir)
		return ch, false, false
	}
	if !r.versions.live {
		return ch, true, false
	}
	if rv, ok := r.versions.seen[ch.Hash]; ok {
		if rv < r.versions.newest {
			r.keptNewer(rv)
			return ch, false, false
		}
		ch.ResourceVersion = strconv.FormatUint(rv, 10)
		return ch, true, false
	}
	cur, err := r.opts.API.Get(ctx)
	if err != nil {
		r.log.Warn("loading the scripts folder's change: the ConfigMap cannot be read to tell whether it is the newest", "dir", r.opts.Dir, "error", err)
		return ch, true, false
	}
	rv := r.versions.note(cur)
	switch {
	case cur.Hash == ch.Hash: // the folder is ahead of the watch
		r.versions.newest = max(r.versions.newest, rv)
		ch.ResourceVersion = cur.ResourceVersion
		return ch, true, false
	case rv > r.versions.newest && cur.Hash != r.tried.Hash: // so is the ConfigMap itself
		r.versions.newest = rv
		cur.At = ch.At
		return cur, true, true
	default:
		r.keptNewer(0)
		return ch, false, false
	}
}

// keptNewer tells that the folder holds older scripts than the ConfigMap's serving
// (rv: the folder's resourceVersion, 0 when unknown).
func (r *Reloader) keptNewer(rv uint64) {
	args := []any{"dir", r.opts.Dir, "configmap", r.opts.API.Name(), "resourceVersion", r.versions.newest}
	if rv > 0 {
		args = append(args, "folderResourceVersion", rv)
	}
	r.log.Info("the scripts folder holds older scripts than the ConfigMap's: not loaded (the kubelet's copy lags behind)", args...)
}
