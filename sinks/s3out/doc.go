// Package s3out puts the collector's committed Parquet files into
// S3-compatible object storage (collector.output: s3://bucket/prefix) with
// the same Hive layout as a local output:
// s3://bucket/prefix/flows/dt=YYYY-MM-DD/hour=HH/<writer>-<first>-<last>.parquet.
//
// The Parquet sink writes and commits files in a local staging directory
// (collector.staging_dir), then calls [Store.Upload] for each one and acks
// the messages only after every upload of the roll succeeded; the staged
// file is deleted then. Upload is one PutObject up to PartSize and a
// multipart upload above, each part read straight from the file (no copy
// in memory); an object becomes visible whole or not at all. [Store.List]
// and [Store.Batches] let the sink's dedupe ledger see committed objects
// (a ranged GET of the footer, no data pages).
//
// Credentials come from the standard AWS chain (AWS_ACCESS_KEY_ID /
// AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE and the shared
// config and credentials files, web identity, SSO, container and instance
// roles), optionally with a named profile or an explicit credentials file.
// They are never logged: logs name the endpoint, bucket, prefix, region
// and the credential source only.
//
// Client: github.com/aws/aws-sdk-go-v2 (service/s3 only; multipart is done
// here from file sections, no transfer manager).
package s3out
