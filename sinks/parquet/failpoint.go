package parquet

// FailpointEnv names the environment variable of the sink's one fault
// injection point, for crash tests of the real binary:
// TAPFLOW_FAILPOINT=parquet-after-commit:N makes the process SIGKILL itself
// right after its N-th commit (files renamed and fsynced), before any of
// the commit's batches is acked — the instant a redelivery of committed
// data is certain.
//
// It is compiled in only with the build tag tapflow_failpoints
// (failpoint_on.go; the chaos tests build their binary with it). Release
// builds (make build, make package) have the no-op of failpoint_off.go and
// ignore the variable: the name is kept here so tests compile either way.
const FailpointEnv = "TAPFLOW_FAILPOINT"
