package app

import (
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// catchHangups makes SIGHUP a reload request until stop is called. Go's
// default action for SIGHUP is to exit, so without it a terminal hangup or
// `systemctl reload` kills a daemon; the processes therefore call it on
// their first line, before anything that can wait (NATS, the streams, the
// cloud). Each SIGHUP calls reload, which reports whether it asked for
// anything (the agent: an inventory refresh, once the agent exists);
// when it did not, the log says so and the process keeps running.
func catchHangups(log *slog.Logger, command string, reload func() bool) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range hup {
			if reload() {
				log.Info("SIGHUP: inventory refresh requested")
			} else {
				log.Info("SIGHUP: nothing to reload for " + command)
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		close(hup)
		<-done
	}
}
