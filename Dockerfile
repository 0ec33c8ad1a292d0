# The images of `make image`, for those who build with Docker:
#
#   docker build --target server -t gpupool/gpupool:$(cat VERSION) .
#   docker build --target client -t gpupool/gpupool-client:$(cat VERSION) .
#
# NOT TESTED HERE: this project builds its images without Docker (`make
# image`, deploy/README.md) and no test runs this file. The binaries are
# built by the same make target; gpupool-server's glibc comes from
# distroless's Debian 12 image instead of the build machine (the build stage
# is Debian 12 too, so that the glibc it links against is not newer), and
# the digests are not make image's.

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN make image-binaries && mkdir /out \
 && mv bin/image/bin/gpupool /out/ && mv bin/image/bin /out/server

FROM gcr.io/distroless/base-debian12:nonroot AS server
COPY --from=build /out/server/ /usr/local/bin/
ENV PATH=/usr/local/bin
USER 65532:65532

FROM scratch AS client
COPY --from=build /out/gpupool /usr/local/bin/gpupool
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/gpupool"]
