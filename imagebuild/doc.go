// Package imagebuild builds luaop's container image without Docker: the image the
// Dockerfile describes (a static luaop binary at /luaop, user 65532, entrypoint
// /luaop, command `run /scripts`, the folder /scripts, no handlers unless asked),
// written as an image archive (`docker save`'s format) that `ctr images import`,
// `docker load` and `kind load image-archive` all take. It also builds the pause
// image of the local node (localcluster/node-up.sh), for which no registry is
// reachable here.
//
// The Dockerfile stays the recipe for registries; this package is the second recipe,
// and its tests check that both agree (Recipe holds what both must say). It owns
// nothing at run time: Build compiles, assembles layers in memory and returns an
// image (go-containerregistry's v1.Image); WriteArchive writes it.
//
// It imports no luaop package: cmd/luaop-image and the node suite (e2e/node) call
// it; the binary it builds is compiled from the source tree, never linked in.
package imagebuild
