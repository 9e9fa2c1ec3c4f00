// Command chaosnats runs tapflow's embedded nats-server (transport.Embedded:
// JetStream, the tapflow streams created) as a process of its own, for
// the chaos tests: they SIGTERM it (a graceful shutdown, JetStream
// flushed) and start it again on the same port and store.
//
// Out of the test process, the server is not built with the race detector:
// the tests' -race watches tapflow's code (the in-process agent), not
// nats-server's internals, and the server does not slow the tests down.
//
//	chaosnats -store DIR [-listen 127.0.0.1:0]
//
// prints "ready nats://HOST:PORT" on stdout once it accepts connections and
// the streams exist; it logs warnings and errors to stderr.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tapflow/tapflow/transport"
)

func main() {
	store := flag.String("store", "", "JetStream store directory (required)")
	listen := flag.String("listen", "127.0.0.1:0", "host:port to listen on (port 0: any free port)")
	flag.Parse()
	if *store == "" {
		fmt.Fprintln(os.Stderr, "chaosnats: -store is required")
		os.Exit(2)
	}
	if err := run(*store, *listen); err != nil {
		fmt.Fprintln(os.Stderr, "chaosnats:", err)
		os.Exit(1)
	}
}

func run(store, listen string) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	e, err := transport.NewEmbedded(store, listen, "chaos", log)
	if err != nil {
		return err
	}
	if err := e.Start(); err != nil {
		return err
	}
	defer e.Close()
	nc, err := e.Connect("chaos-admin", log)
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	err = transport.EnsureStreams(ctx, js, transport.DefaultConfig(), log)
	cancel()
	nc.Close()
	if err != nil {
		return err
	}
	fmt.Printf("ready %s\n", e.ClientURL())
	<-sig
	return nil // deferred Close: shut down, wait for JetStream to flush
}
