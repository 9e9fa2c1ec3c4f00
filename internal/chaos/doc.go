// Package chaos holds test helpers that break real connections and
// processes: a loopback TCP proxy whose traffic can be cut and restored
// (a network partition between two real components), and a child-process
// runner that kills with SIGKILL. Everything stays on 127.0.0.1.
package chaos
