package app

import (
	"fmt"
	"sync"
	"time"

	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/sinks/parquet"
	"github.com/tapflow/tapflow/sinks/s3out"
)

// outputs builds the object store of an s3:// collector output once per
// process, shared by the flow and meter sinks (one set of metrics).
var outputs sync.Map // *runtime → *outputOnce

type outputOnce struct {
	once   sync.Once
	remote parquet.Remote
	err    error
}

// remoteOutput returns the parquet.Remote for cfg's output, or nil for a
// local directory.
func remoteOutput(cfg config.Config, rt *runtime) (parquet.Remote, error) {
	if !parquet.IsRemote(cfg.Collector.Parquet.Output) {
		return nil, nil
	}
	v, _ := outputs.LoadOrStore(rt, &outputOnce{})
	o := v.(*outputOnce)
	o.once.Do(func() {
		st, err := s3out.New(cfg.Collector.Parquet.Output, cfg.Collector.S3, s3out.Options{Logger: rt.log.With("process", "collector"), Registry: rt.reg})
		if err != nil {
			o.err = fmt.Errorf("s3 output: %w", err)
			return
		}
		o.remote = st
	})
	return o.remote, o.err
}

// ledgerRefresh is how stale the dedupe ledger's view of other
// collectors' files may be: ack_wait/3 (at most 10s), below the earliest
// redelivery after a crash (2/3 ack_wait after the last in-progress ack).
func ledgerRefresh(cfg config.Config) time.Duration {
	return min(10*time.Second, cfg.Collector.Consumer.AckWait.D()/3)
}
