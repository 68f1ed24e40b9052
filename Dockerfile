# syntax=docker/dockerfile:1
# watchsan's container image: a static binary on distroless's static nonroot base (CA
# certificates, /etc/passwd with user 65532, /tmp; no shell, no libc). `make image` builds the
# same image without a container engine (hack/image). Build:
#   docker build --build-arg VERSION=$(git describe --always --dirty) -t watchsan .
# Cross-build: docker buildx build --platform linux/amd64,linux/arm64 ...
ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
ARG TARGETOS=linux
ARG TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-X github.com/watchsan/watchsan/internal/cli.Version=${VERSION}" \
      -o /out/watchsan ./cmd/watchsan

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
ARG REVISION=
LABEL org.opencontainers.image.title="watchsan" \
      org.opencontainers.image.source="https://github.com/watchsan/watchsan" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build --chown=65532:65532 --chmod=0755 /out/watchsan /watchsan
USER 65532:65532
WORKDIR /
ENTRYPOINT ["/watchsan"]
