package lookup

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// FuzzHandle: a lookup request body as inventory serve receives it from
// any agent. No panic; the reply is one of the known ones, and only a
// valid unicast MAC is queried.
func FuzzHandle(f *testing.F) {
	for _, s := range []string{"fa:16:3e:00:00:01", "FA-16-3E-00-00-01", "fa16.3e00.0001", "01:00:5e:00:00:01", "", "zz", "00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00", "fa:16:3e:00:00:01\x00"} {
		f.Add(s)
	}
	now := time.Unix(1700000000, 0)
	f.Fuzz(func(t *testing.T, body string) {
		var asked []string
		s, err := NewServer(func(mac string) { asked = append(asked, mac) }, ServerOptions{Registry: prometheus.NewRegistry(), Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		switch r := s.Handle(body); r {
		case ReplyQueried:
			if len(asked) != 1 || len(asked[0]) != len("fa:16:3e:00:00:01") {
				t.Fatalf("queried %q for %q", asked, body)
			}
		case ReplyInvalid, ReplyCoalesced, ReplyLimited:
			if len(asked) != 0 {
				t.Fatalf("%s but queried %q", r, asked)
			}
		default:
			t.Fatalf("reply %q", r)
		}
	})
}
