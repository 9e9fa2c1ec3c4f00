package versitygw_test

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/tapflow/tapflow/internal/testkit/versitygw"
)

// TestStartPutGetRestart: the real gateway stores an object, survives a
// kill and restart on the same port and root, and still serves it.
func TestStartPutGetRestart(t *testing.T) {
	srv := versitygw.Start(t, "")
	srv.MakeBucket(t, "flows")
	body := bytes.Repeat([]byte("tapflow"), 1000)
	ctx := context.Background()
	c := srv.Client()
	if _, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("flows"), Key: aws.String("a/b.parquet"), Body: bytes.NewReader(body)}); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	if _, err := c.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String("flows")}); err == nil {
		t.Fatal("gateway answers after Stop")
	}
	srv.Restart(t)
	out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("flows"), Key: aws.String("a/b.parquet")})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(out.Body)
	out.Body.Close()
	if !bytes.Equal(got, body) {
		t.Fatalf("read back %d bytes, want %d", len(got), len(body))
	}
	if objs := srv.Objects(t, "flows", "a/"); objs["a/b.parquet"] != int64(len(body)) {
		t.Fatalf("listing: %v", objs)
	}
}
