// Package chaos holds test helpers that break real connections and
// processes: a loopback TCP proxy whose traffic can be cut and restored
// (a network partition between two real components), a child-process
// runner that kills with SIGKILL, a single nats-server that can be
// stopped and started (tapflow's linked version, or a stock binary such
// as Debian's 2.9.10), and a JetStream cluster of real nats-server
// processes whose nodes can be killed and restarted with their stores.
// Everything stays on 127.0.0.1.
package chaos
