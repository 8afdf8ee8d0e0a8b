# luaop image: a static binary on distroless, with no handlers: /scripts is the
# ConfigMap deploy/base mounts (an overlay's luaop-scripts). Without a mount, luaop run
# /scripts says that /scripts is not a folder of Lua scripts. To try the examples:
#   docker run -v "$PWD/scripts/examples:/scripts:ro" ... luaop run /scripts
#
#   docker build -t luaop:latest --build-arg VERSION=$(git describe --tags --always --dirty) .
#   make image                     (the same)
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/luaop:TAG .
#
# The build stage needs only the Go module proxy (GOPROXY, default proxy.golang.org).

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOTOOLCHAIN=local
# Modules first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# Cross-compiles for the target platform of buildx (empty: the build platform).
ARG TARGETOS
ARG TARGETARCH
# The version `luaop --version` prints: --build-arg VERSION=$(git describe --tags
# --always --dirty), as `make image` does (.git is not part of the build context).
ARG VERSION=devel
RUN GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -ldflags "-s -w -X main.version=$VERSION" -o /luaop ./cmd/luaop

FROM gcr.io/distroless/static:nonroot
COPY --from=build /luaop /luaop
USER 65532:65532
ENTRYPOINT ["/luaop"]
CMD ["run", "/scripts"]
