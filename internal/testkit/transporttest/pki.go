package transporttest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is a test CA (crypto/x509) with a server certificate for 127.0.0.1
// and localhost and a client certificate, written as PEM files (keys
// 0600), and a second CA that signed none of them.
type PKI struct{ CA, ServerCert, ServerKey, ClientCert, ClientKey, OtherCA string }

// NewPKI writes a PKI into dir.
func NewPKI(t testing.TB, dir string) PKI {
	t.Helper()
	write := func(name, typ string, der []byte, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	keyDER := func(k *ecdsa.PrivateKey) []byte {
		b, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	serial := int64(1)
	sign := func(tmpl, parent *x509.Certificate, pub, priv any) []byte {
		serial++
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, priv)
		if err != nil {
			t.Fatal(err)
		}
		return der
	}
	mkCA := func(name string) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
		k := newKey()
		tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: name}, IsCA: true, BasicConstraintsValid: true,
			KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
		der := sign(tmpl, tmpl, &k.PublicKey, k)
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		return c, k, der
	}
	ca, caKey, caDER := mkCA("tapflow test CA")
	_, _, otherDER := mkCA("some other CA")
	var p PKI
	p.CA = write("ca.pem", "CERTIFICATE", caDER, 0o644)
	p.OtherCA = write("other-ca.pem", "CERTIFICATE", otherDER, 0o644)
	sk := newKey()
	p.ServerCert = write("server.pem", "CERTIFICATE", sign(&x509.Certificate{Subject: pkix.Name{CommonName: "nats"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}, ca, &sk.PublicKey, caKey), 0o644)
	p.ServerKey = write("server-key.pem", "PRIVATE KEY", keyDER(sk), 0o600)
	ck := newKey()
	p.ClientCert = write("client.pem", "CERTIFICATE", sign(&x509.Certificate{Subject: pkix.Name{CommonName: "agent"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}, ca, &ck.PublicKey, caKey), 0o644)
	p.ClientKey = write("client-key.pem", "PRIVATE KEY", keyDER(ck), 0o600)
	return p
}
