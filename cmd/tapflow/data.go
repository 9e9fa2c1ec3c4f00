package main

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/tapflow/tapflow/internal/config"
	"github.com/tapflow/tapflow/internal/dataset"
)

// dataFlags are the flags of the commands reading a collector output
// (report, audit): --data and the S3 access settings, taken from a config
// file's collector.s3 section and overridden by flags.
type dataFlags struct {
	data, config, endpoint, region string
	pathStyle                      bool
}

func (d *dataFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&d.data, "data", "", "the collector output: a `DIR` (holding flows/ and meters/) or s3://bucket/prefix")
	fs.StringVar(&d.config, "config", "", "config `FILE` whose collector.s3 section (endpoint, region, path_style, profile, credentials_file) reads an s3:// --data")
	fs.StringVar(&d.endpoint, "s3-endpoint", "", "S3 API `URL` of an S3-compatible server (overrides collector.s3.endpoint); credentials come from the AWS chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE)")
	fs.StringVar(&d.region, "s3-region", "", "S3 region (overrides collector.s3.region)")
	fs.BoolVar(&d.pathStyle, "s3-path-style", false, "address buckets as <endpoint>/<bucket> (most S3-compatible servers need it)")
}

// open validates the flags and opens the output.
func (d *dataFlags) open(ctx context.Context) (*dataset.Output, error) {
	if d.data == "" {
		return nil, fmt.Errorf("--data is required: the collector output directory or s3://bucket/prefix")
	}
	var opts dataset.Options
	if d.config != "" {
		cfg, err := config.Load(d.config)
		if err != nil {
			return nil, fmt.Errorf("--config %s: %w", d.config, err)
		}
		opts.S3 = cfg.Collector.S3
	}
	set(&opts.S3.Endpoint, d.endpoint)
	set(&opts.S3.Region, d.region)
	opts.S3.PathStyle = opts.S3.PathStyle || d.pathStyle
	out, err := dataset.Open(ctx, d.data, opts)
	if err != nil {
		return nil, fmt.Errorf("--data %s: %w", d.data, err)
	}
	return out, nil
}
