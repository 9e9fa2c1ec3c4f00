// Package versitygw runs a real S3-compatible server for tests: the
// Apache-2.0 Versity S3 Gateway with its posix backend, as a child process
// on 127.0.0.1 storing into a temp directory. The binary is built once with
// `go install github.com/versity/versitygw/cmd/versitygw@<Version>` into
// ~/.cache/tapflow/versitygw-<Version>/ (or taken from $TAPFLOW_VERSITYGW)
// and reused by every clone on the machine; `make versitygw` builds it ahead
// of `go test` so no test pays the ~2 min cold build.
// Never an AGPL server.
package versitygw
