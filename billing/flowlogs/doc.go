// Package flowlogs delivers tenant flow logs: for one closed hour, each
// project's flow.v1 records of that hour (time_end in [H, H+1h), the
// collector's dt=/hour= partition), and nothing else, to that project's own
// S3 location — a bucket or prefix per project from the template
// billing.flow_logs.location (s3://flowlogs-{project_id}/tapflow,
// s3://tenant-logs/{project_id}) — as one Parquet object per project and
// hour with the AWS VPC Flow Logs v5 field names where a field has an
// equivalent, plus tapflow's own columns (zone, external_network, lb_id …).
//
// A project gets the records of its own ports (tenant_id; an amphora's
// records are the load balancer owner's, as for billing). Records where it
// is only the peer (peer_tenant_id) are not delivered: they name another
// project's ports, servers and hypervisors, and the project has its own
// tap's record of the same traffic whenever its VM is in the cloud.
// Columns another project could learn from (peer_tenant_id, peer_mac,
// node, ifname, agent_id) are left out.
//
// Deliverer.Deliver reads the hour with the readers of tapflow report and
// audit (internal/dataset: a directory or s3://), writes each project's
// file in billing.flow_logs.staging_dir (0600) and uploads it with
// sinks/s3out using the delivering process's own credentials
// (billing.flow_logs.s3). The object key is a function of the project and
// the hour only (Key), so delivering an hour again overwrites it: a
// correction (a late record) is delivered by delivering the hour again.
// The caller decides that the hour is closed and its audit passed
// (billing/usage's loop, or an operator running `tapflow billing flowlogs
// deliver`). docs/billing.md has the field mapping and the layout.
package flowlogs
