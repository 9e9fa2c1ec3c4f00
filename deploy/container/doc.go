// Package container holds the container image of tapflow (Containerfile,
// build.sh, built by `make image`) and its test: the agent and the
// collector run from the image under podman, the agent with exactly
// CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON, with and without the host's
// bpffs bind-mounted (docs/containers.md).
package container
