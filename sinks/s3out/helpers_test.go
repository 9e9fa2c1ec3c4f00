package s3out_test

import (
	"bytes"

	pq "github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/schemas"
)

func parquetRead(b []byte) ([]schemas.Flow, error) {
	return pq.Read[schemas.Flow](bytes.NewReader(b), int64(len(b)))
}
