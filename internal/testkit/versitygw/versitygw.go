package versitygw

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// Version is the versitygw release tests run against.
const Version = "v1.8.0"

// Module is what `go install` builds.
const Module = "github.com/versity/versitygw/cmd/versitygw"

// Credentials of the gateway's root account (test only).
const (
	AccessKey = "tapflow-test-key"
	SecretKey = "tapflow-test-secret"
	Region    = "us-east-1"
)

var buildMu sync.Mutex

// Binary returns the path of the versitygw binary, building it if needed:
// $TAPFLOW_VERSITYGW when set, else <user cache dir>/tapflow/versitygw-<Version>/versitygw
// (~/.cache/tapflow/…, so fresh clones on one machine, CI's included, share
// it; `make versitygw` builds the same path).
func Binary() (string, error) {
	if p := os.Getenv("TAPFLOW_VERSITYGW"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("versitygw: $TAPFLOW_VERSITYGW=%s: %w", p, err)
		}
		return p, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("versitygw: no cache directory (set $HOME or $XDG_CACHE_HOME, or $TAPFLOW_VERSITYGW): %w", err)
	}
	bin := filepath.Join(cache, "tapflow", "versitygw-"+Version)
	p := filepath.Join(bin, "versitygw")
	buildMu.Lock()
	defer buildMu.Unlock()
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", fmt.Errorf("versitygw: %w", err)
	}
	// One build at a time across test processes.
	lock, err := os.OpenFile(filepath.Join(bin, ".versitygw.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return "", fmt.Errorf("versitygw: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("versitygw: lock: %w", err)
	}
	if ok, _ := hasVersion(p); ok {
		return p, nil
	}
	cmd := exec.Command("go", "install", Module+"@"+Version)
	cmd.Env = append(os.Environ(), "GOBIN="+bin, "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	cmd.Dir = os.TempDir() // outside any module
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("versitygw: go install %s@%s (needs the Go module proxy; or set $TAPFLOW_VERSITYGW to a binary): %w\n%s", Module, Version, err, out)
	}
	if ok, v := hasVersion(p); !ok {
		return "", fmt.Errorf("versitygw: built %s but it reports version %q, want %s", p, v, Version)
	}
	return p, nil
}

// hasVersion reports whether p exists and was built from release Version
// (read from the binary's embedded module information).
func hasVersion(p string) (bool, string) {
	bi, err := buildinfo.ReadFile(p)
	if err != nil {
		return false, ""
	}
	return bi.Main.Path == "github.com/versity/versitygw" && bi.Main.Version == Version, bi.Main.Path + "@" + bi.Main.Version
}

// RepoRoot is the directory of the tapflow main module's go.mod, found by
// walking up from the working directory (works from compat/ too).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && bytes.Contains(b, []byte("module github.com/tapflow/tapflow\n")) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("versitygw: no tapflow go.mod above %s", dir)
		}
	}
}

// Server is a running gateway.
type Server struct {
	// Endpoint is http://127.0.0.1:PORT.
	Endpoint string
	// Root is the posix backend directory (bucket = subdirectory).
	Root string
	// IAMDir holds the gateway's internal IAM accounts (StartWith
	// Options.IAM); "" without.
	IAMDir string
	addr   string
	bin    string
	log    *os.File

	mu  sync.Mutex
	cmd *exec.Cmd
}

// Start builds (once) and starts a gateway on a free loopback port storing
// in root (a new temp dir when ""). It is stopped in t.Cleanup.
func Start(t testing.TB, root string) *Server {
	t.Helper()
	return StartWith(t, root, Options{})
}

// Options of StartWith.
type Options struct {
	// IAM runs the gateway's internal IAM (accounts stored in a temp
	// directory): CreateUser adds accounts besides the root one, whose
	// access is decided by bucket policies (PutBucketPolicy) and ACLs.
	IAM bool
}

// StartWith is Start with options.
func StartWith(t testing.TB, root string, opts Options) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	if root == "" {
		root = t.TempDir()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	logf, err := os.Create(filepath.Join(t.TempDir(), "versitygw.log"))
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Endpoint: "http://" + addr, Root: root, addr: addr, bin: bin, log: logf}
	if opts.IAM {
		s.IAMDir = t.TempDir()
	}
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("versitygw log tail:\n%s", b)
		}
		logf.Close()
	})
	return s
}

func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("versitygw: already running")
	}
	args := []string{"--port", s.addr}
	if s.IAMDir != "" {
		args = append(args, "--iam-dir", s.IAMDir)
	}
	cmd := exec.Command(s.bin, append(args, "posix", s.Root)...)
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY="+AccessKey, "ROOT_SECRET_KEY="+SecretKey)
	cmd.Stdout, cmd.Stderr = s.log, s.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("versitygw: start %s: %w", s.bin, err)
	}
	s.cmd = cmd
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			s.cmd = nil
			return fmt.Errorf("versitygw exited at start (%v); see %s", err, s.log.Name())
		default:
		}
		resp, err := http.Get(s.Endpoint + "/")
		if err == nil {
			resp.Body.Close()
			// Keep reaping the process in the background.
			go func() { <-exited }()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	s.cmd = nil
	return fmt.Errorf("versitygw: not answering on %s after 20s; see %s", s.addr, s.log.Name())
}

// Stop kills the gateway (SIGKILL: an abrupt outage) and waits briefly
// for the port to close. It is idempotent.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	s.cmd = nil
	for range 200 {
		c, err := net.DialTimeout("tcp", s.addr, 50*time.Millisecond)
		if err != nil {
			return
		}
		c.Close()
		time.Sleep(10 * time.Millisecond)
	}
}

// Restart starts the gateway again on the same port and root.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
}

// Client returns an S3 client for the gateway (path-style, root account).
func (s *Server) Client() *s3.Client {
	return s3.New(s3.Options{
		BaseEndpoint: aws.String(s.Endpoint),
		Region:       Region,
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
	})
}

// ClientAs returns an S3 client signing as another account (CreateUser).
func (s *Server) ClientAs(access, secret string) *s3.Client {
	return s3.New(s3.Options{
		BaseEndpoint: aws.String(s.Endpoint),
		Region:       Region,
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(access, secret, ""),
	})
}

// CreateUser adds an account through the gateway's admin API (what
// `versitygw admin create-user` sends, signed by the root account; the
// secret stays off any command line). role is user, userplus or admin.
// Needs Options.IAM.
func (s *Server) CreateUser(t testing.TB, access, secret, role string) {
	t.Helper()
	if s.IAMDir == "" {
		t.Fatal("versitygw: CreateUser needs a gateway started with Options{IAM: true}")
	}
	type Account struct{ Access, Secret, Role string }
	body, err := xml.Marshal(Account{access, secret, role})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPatch, s.Endpoint+"/create-user", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(body)
	hash := hex.EncodeToString(sum[:])
	req.Header.Set("X-Amz-Content-Sha256", hash)
	if err := v4.NewSigner().SignHTTP(context.Background(), aws.Credentials{AccessKeyID: AccessKey, SecretAccessKey: SecretKey}, req, hash, "s3", Region, time.Now()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("versitygw create-user %s: %v", access, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("versitygw create-user %s: %s: %s", access, resp.Status, b)
	}
}

// PutBucketPolicy sets a bucket's policy (JSON) as the root account.
func (s *Server) PutBucketPolicy(t testing.TB, bucket, policy string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.Client().PutBucketPolicy(ctx, &s3.PutBucketPolicyInput{Bucket: aws.String(bucket), Policy: aws.String(policy)}); err != nil {
		t.Fatalf("put bucket policy on %s: %v", bucket, err)
	}
}

// MakeBucket creates a bucket.
func (s *Server) MakeBucket(t testing.TB, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		t.Fatalf("create bucket %s on %s: %v", name, s.Endpoint, err)
	}
}

// Objects lists every key under prefix in bucket with its size.
func (s *Server) Objects(t testing.TB, bucket, prefix string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	p := s3.NewListObjectsV2Paginator(s.Client(), &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String(prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(context.Background())
		if err != nil {
			t.Fatalf("list s3://%s/%s: %v", bucket, prefix, err)
		}
		for _, o := range page.Contents {
			out[aws.ToString(o.Key)] = aws.ToInt64(o.Size)
		}
	}
	return out
}

// Get reads an object whole.
func (s *Server) Get(t testing.TB, bucket, key string) []byte {
	t.Helper()
	out, err := s.Client().GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		t.Fatalf("get s3://%s/%s: %v", bucket, key, err)
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err != nil {
		t.Fatalf("read s3://%s/%s: %v", bucket, key, err)
	}
	return b
}

// LogContains reports whether the gateway's log has s (diagnostics).
func (s *Server) LogContains(str string) bool {
	f, err := os.Open(s.log.Name())
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.Contains(sc.Text(), str) {
			return true
		}
	}
	return false
}
