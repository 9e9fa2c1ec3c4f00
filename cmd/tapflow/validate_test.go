package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestValidate: config files with ${NAME} references and every kind of
// problem, and --inventory with the file provider's loader and guards.
func TestValidate(t *testing.T) {
	const secret = "hunter2.s3cr3t"
	t.Setenv("TAPFLOW_TEST_SECRET", secret)
	t.Setenv("TAPFLOW_TEST_NODE", "cmp1")
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	inv := write("inv.yaml", "projects:\n  - id: t1\n    name: shop\nnetworks:\n  - id: n1\n    project_id: t1\nports:\n  - id: p1\n    mac_address: fa:16:3e:00:00:01\n    project_id: t1\n    network_id: n1\n    device_owner: compute:nova\n")
	invCfg := write("inv-cfg.yaml", "node: a\ninventory:\n  file: "+inv+"\n")
	var dump, dumpErr bytes.Buffer
	if code := run([]string{"inventory", "dump", "--config", invCfg}, &dump, &dumpErr); code != exitOK {
		t.Fatalf("inventory dump: exit %d: %s", code, dumpErr.String())
	}
	cases := []struct {
		name     string
		args     []string
		code     int
		out, err []string
	}{
		{"env expanded", []string{write("env.yaml", "node: ${TAPFLOW_TEST_NODE}\ndata_dir: ${TAPFLOW_TEST_DATA:-/srv/tf}\n")}, exitOK, []string{"env.yaml: ok"}, nil},
		{"unset variable names it and the line", []string{write("unset.yaml", "node: a\nnats:\n  url: ${TAPFLOW_TEST_UNSET}\n")}, exitUsage, nil,
			[]string{"nats.url: ${TAPFLOW_TEST_UNSET} is not set (line 3); export TAPFLOW_TEST_UNSET"}},
		{"type error hides nothing", []string{write("types.yaml", "node: a\nsource: tape\nagent:\n  edge_capacity: lots\nnats:\n  url: http://h\n")}, exitUsage, nil,
			[]string{`source: "tape": unknown source`, "agent.edge_capacity: cannot unmarshal", `nats.url: "http://h": scheme "http"`}},
		{"secret never printed", []string{write("secret.yaml", "node: ${TAPFLOW_TEST_SECRET}\nagent:\n  edge_capacity: ${TAPFLOW_TEST_SECRET}\n")}, exitUsage, nil,
			[]string{`node: "${TAPFLOW_TEST_SECRET}": not usable`, "agent.edge_capacity: cannot unmarshal !!str `${TAPFLOW_TEST_SECRET}`"}},
		{"inventory", []string{"--inventory", inv}, exitOK, []string{"inv.yaml: ok: 1 projects, 1 networks, 0 subnets, 1 ports", "0 warnings"}, nil},
		{"config and inventory", []string{invCfg, "--inventory", inv}, exitOK, []string{"inv-cfg.yaml: ok", "inv.yaml: ok"}, nil},
		{"config checks the inventory file it names", []string{invCfg}, exitOK, []string{"inv-cfg.yaml: ok", "inv.yaml: ok: 1 projects"}, nil},
		{"a bad inventory named by the config fails", []string{write("bad-inv-cfg.yaml", "node: a\ninventory:\n  file: "+write("bad-inv.yaml", "networks: 3\n")+"\n")}, exitUsage,
			[]string{"bad-inv-cfg.yaml: ok"}, []string{"bad-inv.yaml: invalid", "networks: line 1: must be a list"}},
		{"dump output validates", []string{"--inventory", write("dump.yaml", dump.String())}, exitOK, []string{"dump.yaml: ok: 1 projects"}, nil},
		{"inventory warnings", []string{"--inventory", write("warn.yaml", "ports:\n  - id: p1\n    mac_address: fa:16:3e:00:00:01\n    project_id: t1\n    network_id: n9\n    device_owner: compute:nova\n  - id: p2\n    mac_address: fa:16:3e:00:00:01\n    project_id: t2\n    network_id: n9\n    device_owner: compute:nova\n")},
			exitOK, []string{"warning: duplicate_mac", "warnings"}, nil},
		{"inventory errors", []string{"--inventory", write("bad.yaml", "ports:\n  - id: p1\n    fixed_ips: x\nnetworks: 3\nfrobs: []\n")}, exitUsage, nil,
			[]string{"ports[0] (id p1): fixed_ips: line 3", "networks: line 4: must be a list", `unknown collection "frobs"`}},
		{"empty inventory refused", []string{"--inventory", write("empty.yaml", "\n")}, exitUsage, nil, []string{"no collections (a truncated or half-written file?)"}},
		{"missing inventory", []string{"--inventory", filepath.Join(dir, "nope.yaml")}, exitUsage, nil, []string{"nope.yaml: no such file"}},
		{"bad config and bad inventory both reported", []string{write("bad-cfg.yaml", "source: tape\n"), "--inventory", filepath.Join(dir, "nope.yaml")}, exitUsage, nil,
			[]string{`source: "tape"`, "nope.yaml"}},
		// 0.25 × 1 GiB over 60 s = 4.47 MB/s = 82,090 records/s at lz4's 54.5 B.
		{"sustained rate", []string{write("rate.yaml", "node: a\nnats:\n  stream_max_bytes: 1GiB\ncollector:\n  roll_age: 1m\n  early_commit_share: 0.25\n")}, exitOK,
			[]string{"rate.yaml: TAPFLOW_FLOWS: files roll by roll_age 1m0s up to 4.5 MB/s of the fleet's publishes ≈ 82090 records/s at 54.5 B/record (lz4) and 83 agent batches/s",
				"early_commit_share 0.25 × max_bytes 1GiB, × max_ack_pending 20000", "rate.yaml: TAPFLOW_METERS: files roll by roll_age 1m0s up to 4.5 MB/s"}, nil},
		{"early_commit_share out of range", []string{write("share.yaml", "node: a\ncollector:\n  early_commit_share: 1.5\n")}, exitUsage, nil,
			[]string{"collector.early_commit_share: 1.5: out of range"}},
		{"nothing to check", nil, exitUsage, nil, []string{"give one config file, --inventory FILE, or both"}},
		{"two configs", []string{invCfg, invCfg}, exitUsage, nil, []string{"give one config file"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(append([]string{"validate"}, tc.args...), &out, &errb); code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.code, out.String(), errb.String())
			}
			for _, s := range tc.out {
				if !strings.Contains(out.String(), s) {
					t.Errorf("stdout lacks %q:\n%s", s, out.String())
				}
			}
			for _, s := range tc.err {
				if !strings.Contains(errb.String(), s) {
					t.Errorf("stderr lacks %q:\n%s", s, errb.String())
				}
			}
			if strings.Contains(out.String()+errb.String(), "hunter2") {
				t.Fatalf("secret printed:\n%s%s", out.String(), errb.String())
			}
		})
	}
}

// TestValidateOpenStackAuth: with inventory.provider: openstack, validate
// resolves the credentials start-up would use and checks auth_url,
// without contacting Keystone and without printing the password.
func TestValidateOpenStackAuth(t *testing.T) {
	dir := t.TempDir()
	for _, k := range []string{"OS_CLOUD", "OS_AUTH_URL", "OS_USERNAME", "OS_PASSWORD", "OS_PROJECT_NAME", "OS_CLIENT_CONFIG_FILE"} {
		t.Setenv(k, "")
	}
	clouds := filepath.Join(dir, "clouds.yaml")
	if err := os.WriteFile(clouds, []byte(`clouds:
  noscheme:
    auth: {auth_url: "keystone.example:5000/v3", username: u, password: pw-s3cr3t, project_name: p}
  badport:
    auth: {auth_url: "https://keystone.example:99999/v3", username: u, password: pw-s3cr3t, project_name: p}
  good:
    auth: {auth_url: "https://keystone.example:5000/v3", username: u, password: pw-s3cr3t, project_name: p}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := func(name, openstack string) string {
		p := filepath.Join(dir, name+".yaml")
		body := "node: a\ninventory:\n  provider: openstack\n  openstack:\n" + openstack
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name, section string
		env           map[string]string
		code          int
		want          string
	}{
		{"clouds.yaml ok", "    cloud: good\n    clouds_file: " + clouds + "\n", nil, exitOK, "ok"},
		{"auth_url without scheme", "    cloud: noscheme\n    clouds_file: " + clouds + "\n", nil, exitUsage, `auth_url "keystone.example:5000/v3": scheme`},
		{"auth_url bad port", "    cloud: badport\n    clouds_file: " + clouds + "\n", nil, exitUsage, "port 99999 is not 1..65535"},
		{"no such entry", "    cloud: nope\n    clouds_file: " + clouds + "\n", nil, exitUsage, `clouds.yaml entry "nope"`},
		{"OS_AUTH_URL ftp", "    interface: public\n", map[string]string{"OS_AUTH_URL": "ftp://keystone.example/v3", "OS_USERNAME": "u", "OS_PASSWORD": "pw-s3cr3t", "OS_PROJECT_NAME": "p"},
			exitUsage, `OS_* environment: auth_url "ftp://keystone.example/v3": scheme "ftp", want http or https`},
		{"no credentials at all", "    interface: public\n", nil, exitUsage, "OS_CLOUD, inventory.openstack.cloud and OS_AUTH_URL are all unset"},
		{"noauth URL", "    noauth:\n      neutron: 127.0.0.1:9696\n", nil, exitUsage, "inventory.openstack.noauth.neutron:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var out, errb bytes.Buffer
			if code := run([]string{"validate", cfg(strings.ReplaceAll(tc.name, " ", "-"), tc.section)}, &out, &errb); code != tc.code {
				t.Fatalf("exit %d, want %d: %s%s", code, tc.code, out.String(), errb.String())
			}
			if !strings.Contains(out.String()+errb.String(), tc.want) {
				t.Fatalf("output lacks %q:\n%s%s", tc.want, out.String(), errb.String())
			}
			if strings.Contains(out.String()+errb.String(), "pw-s3cr3t") {
				t.Fatalf("password printed")
			}
		})
	}
}
