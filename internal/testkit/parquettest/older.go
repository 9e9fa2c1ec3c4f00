package parquettest

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"time"

	pq "github.com/parquet-go/parquet-go"

	"github.com/tapflow/tapflow/schemas"
)

// WriteOlderMinor writes recs as a collector of flow.v1.<minor> wrote
// them, before the columns added since (Since > minor) existed: one file
// per hourly partition under root/flows/dt=…/hour=…/<name>.parquet, with
// tapflow.schema = flow.v1 and tapflow.schema_version = 1.<minor>. It is
// how the schema-evolution tests get a directory mixing files from before
// and after a minor version. It returns the files written.
func WriteOlderMinor(root, name string, minor int, recs []schemas.Flow) ([]string, error) {
	full := reflect.TypeOf(schemas.Flow{})
	cols := schemas.FlowTable.Columns()
	var fields []reflect.StructField
	var src []int
	for i, c := range cols {
		if c.Since > minor {
			continue
		}
		f, ok := full.FieldByName(c.GoName)
		if !ok {
			return nil, fmt.Errorf("flow.v1 column %s: no field %s", c.Name, c.GoName)
		}
		f.Index, f.Offset = nil, 0
		fields = append(fields, f)
		src = append(src, i)
	}
	typ := reflect.StructOf(fields)
	byHour := map[string][]schemas.Flow{}
	for _, r := range recs {
		t := time.UnixMicro(r.TimeEnd).UTC()
		p := filepath.Join("flows", "dt="+t.Format(time.DateOnly), fmt.Sprintf("hour=%02d", t.Hour()))
		byHour[p] = append(byHour[p], r)
	}
	var out []string
	for part, rs := range byHour {
		dir := filepath.Join(root, part)
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return out, err
		}
		path := filepath.Join(dir, name+".parquet")
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o640)
		if err != nil {
			return out, err
		}
		w := pq.NewWriter(f, pq.SchemaOf(reflect.New(typ).Elem().Interface()),
			pq.KeyValueMetadata(schemas.MetadataKey, schemas.SchemaName),
			pq.KeyValueMetadata(schemas.VersionKey, fmt.Sprintf("1.%d", minor)))
		for i := range rs {
			row := reflect.New(typ).Elem()
			v := reflect.ValueOf(&rs[i]).Elem()
			for j, c := range src {
				row.Field(j).Set(v.FieldByName(cols[c].GoName))
			}
			if err := w.Write(row.Interface()); err != nil {
				f.Close()
				return out, fmt.Errorf("%s: %w", path, err)
			}
		}
		if err := w.Close(); err != nil {
			f.Close()
			return out, fmt.Errorf("%s: %w", path, err)
		}
		if err := f.Close(); err != nil {
			return out, err
		}
		out = append(out, path)
	}
	return out, nil
}
