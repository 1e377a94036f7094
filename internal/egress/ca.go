package egress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// The proxy reads a request to a host with a credential rule (Credential)
// only by ending the worker's TLS itself: it answers the worker's
// handshake with a certificate for the host made on the spot and signed by
// a CA of the server's own, which the sandbox trusts (the worker hands the
// agent a CA bundle with it) and whose key never leaves the server. Hosts
// without a rule are tunnelled as before, end to end.

// CA file names in the directory LoadCA keeps them in.
const (
	caCertFile = "ca.pem"
	caKeyFile  = "ca.key"
)

// Validity of the certificates a CA makes.
const (
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 7 * 24 * time.Hour
	// leafRenew is how long before its end a cached leaf is replaced.
	leafRenew = 24 * time.Hour
	// maxLeaves bounds the cache: a leaf is made only for a host with a
	// rule, so it stays small unless rules are many.
	maxLeaves = 1024
)

// CA signs the certificates the proxy presents for the hosts it
// intercepts. It is safe for concurrent use.
type CA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     *ecdsa.PrivateKey
	// leafKey is the key of every leaf: made once per process, never
	// written down.
	leafKey *ecdsa.PrivateKey
	now     func() time.Time

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// LoadCA reads the CA kept in dir, or makes one there if dir does not
// exist. dir is made whole or not at all (a directory filled beside it and
// renamed), so servers sharing a data root that start together end up
// with the same CA. The key file must be the owner's only (mode 0600).
// The directory must never be mounted in a sandbox.
func LoadCA(dir string) (*CA, error) {
	ca, err := readCA(dir)
	if !errors.Is(err, os.ErrNotExist) {
		return ca, err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "."+filepath.Base(dir)+"-*")
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := writeNewCA(tmp); err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	// Another server may have made one meanwhile: its rename or ours
	// wins, and both read the winner's.
	if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	return readCA(dir)
}

// writeNewCA makes a CA's key and certificate in dir.
func writeNewCA(dir string) error {
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          randomSerial(),
		Subject:               pkix.Name{Organization: []string{"Corral"}, CommonName: "Corral egress CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, caKeyFile), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, caCertFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

// readCA reads the CA in dir; an error wrapping os.ErrNotExist when there
// is none.
func readCA(dir string) (*CA, error) {
	if _, err := os.Stat(dir); err != nil {
		return nil, err
	}
	certPEM, err := os.ReadFile(filepath.Join(dir, caCertFile))
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	kf, err := os.Open(filepath.Join(dir, caKeyFile))
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	defer kf.Close()
	if fi, err := kf.Stat(); err != nil || fi.Mode().Perm()&0o077 != 0 || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("egress CA: %s must be a regular file only its owner can read (mode 0600)", kf.Name())
	}
	keyPEM, err := os.ReadFile(kf.Name())
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, fmt.Errorf("egress CA in %s: not PEM", dir)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("egress CA in %s: %w", dir, err)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("egress CA in %s: %w", dir, err)
	}
	key, ok := k.(*ecdsa.PrivateKey)
	if !ok || !key.PublicKey.Equal(cert.PublicKey) || !cert.IsCA {
		return nil, fmt.Errorf("egress CA in %s: the key does not match the certificate, or it is no CA", dir)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, certPEM: certPEM, key: key, leafKey: leafKey, now: time.Now, leaves: map[string]*tls.Certificate{}}, nil
}

// CertPEM is the CA's certificate, which a sandbox trusts.
func (c *CA) CertPEM() []byte { return c.certPEM }

// CertDER is the CA's certificate in DER.
func (c *CA) CertDER() []byte { return c.cert.Raw }

// leaf is a certificate for host (a name or an IP literal), made once and
// kept until a day before it ends.
func (c *CA) leaf(host string) (*tls.Certificate, error) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.leaves[host]; ok && now.Add(leafRenew).Before(l.Leaf.NotAfter) {
		return l, nil
	}
	end := now.Add(leafValidity)
	if end.After(c.cert.NotAfter) {
		end = c.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: host},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     end,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if a, err := netip.ParseAddr(host); err == nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, a.AsSlice())
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &c.leafKey.PublicKey, c.key)
	if err != nil {
		return nil, fmt.Errorf("certificate for %s: %w", host, err)
	}
	parsed, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	if len(c.leaves) >= maxLeaves {
		clear(c.leaves)
	}
	l := &tls.Certificate{Certificate: [][]byte{der, c.cert.Raw}, PrivateKey: c.leafKey, Leaf: parsed}
	c.leaves[host] = l
	return l, nil
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}
