// Command luaop-image builds luaop's container image without Docker, as an image
// archive: the image the Dockerfile describes (see package imagebuild), for a node
// whose runtime imports archives (`ctr -n k8s.io images import`, `kind load
// image-archive`, `docker load`). `luaop-image pause` builds the pause image of the
// local node.
//
//	go run ./cmd/luaop-image -o bin/luaop-image.tar                       # luaop:latest
//	go run ./cmd/luaop-image -o luaop.tar -t luaop:v1 -version v1 -handlers scripts/examples
//	go run ./cmd/luaop-image pause -o pause.tar
//
// # Boundaries
//
// It only wires flags to package imagebuild, which owns the recipe; it calls
// nothing of the operator.
package main
