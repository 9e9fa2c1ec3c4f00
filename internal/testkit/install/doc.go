// Package install holds the tests of what an operator installs: the
// systemd units of deploy/systemd (systemd-analyze verify and an offline
// security review) and the Debian package of deploy/package, built with
// nfpm, installed with dpkg, and its agent run as the tapflow user with
// only CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON, capturing real traffic on a
// namespace tap. No product code lives here.
package install
