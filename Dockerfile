# luaop image: a static binary on distroless, user 65532, entrypoint /luaop, command
# `run /scripts`. /scripts holds no handler unless asked (--build-arg
# HANDLERS=scripts/examples): deploy/ mounts the scripts' ConfigMap there.
#
#   docker build -t luaop:latest --build-arg VERSION=$(git describe --tags --always --dirty) .
#   make image                     (the same)
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/luaop:TAG .
#
# Without Docker, `make image-archive` builds the same image (cmd/luaop-image, package
# imagebuild) as an image archive; imagebuild's TestDockerfileAgrees checks that the
# two recipes agree (user, entrypoint, command, paths, build flags, handlers).
#
# The build stage needs only the Go module proxy (GOPROXY).

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
# Handlers baked into /scripts only when asked: a folder of the build context whose
# *.lua are copied (--build-arg HANDLERS=scripts/examples, for `docker run` demos).
ARG HANDLERS=
RUN mkdir -p /out/scripts && if [ -n "$HANDLERS" ]; then cp "$HANDLERS"/*.lua /out/scripts/; fi

FROM gcr.io/distroless/static:nonroot
COPY --from=build /luaop /luaop
COPY --from=build /out/scripts /scripts
USER 65532:65532
ENTRYPOINT ["/luaop"]
CMD ["run", "/scripts"]
