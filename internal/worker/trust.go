package worker

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The egress proxy ends the TLS of the hosts that have a credential rule
// under a CA of the server's own. The worker makes the agent trust it: a
// CA bundle of the sandbox's own roots and that CA, written in the
// sandbox's temporary directory, which the usual variables name.

// systemBundles are where images keep their roots (Debian and Alpine,
// then Red Hat and Fedora).
var systemBundles = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"}

// trustVars name a CA bundle for the programs an agent runs: Go and
// OpenSSL, curl, Python's requests and pip, git, Node.js (which adds the
// file to its own roots).
var trustVars = []string{"SSL_CERT_FILE", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS"}

// caBundleName is the bundle's name in the temporary directory.
const caBundleName = "corral-egress-ca.pem"

// ParseEgressCA reads the CA certificate the server hands the sandbox
// (workerproto.EnvEgressCA: DER, base64); nil for "".
func ParseEgressCA(s string) ([]byte, error) {
	if s == "" {
		return nil, nil
	}
	der, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err == nil {
		_, err = x509.ParseCertificate(der)
	}
	if err != nil {
		return nil, fmt.Errorf("the egress CA is not a base64 DER certificate: %w", err)
	}
	return der, nil
}

// TrustEgressCA writes a bundle of the sandbox's roots and the CA in der
// to dir and returns the variables that name it.
func TrustEgressCA(dir string, der []byte) ([]string, error) {
	var bundle []byte
	for _, p := range systemBundles {
		if b, err := os.ReadFile(p); err == nil {
			bundle = append(b, '\n')
			break
		}
	}
	bundle = append(bundle, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	path := filepath.Join(dir, caBundleName)
	tmp, err := os.CreateTemp(dir, "."+caBundleName+"-*")
	if err != nil {
		return nil, fmt.Errorf("write the egress CA bundle: %w", err)
	}
	_, err = tmp.Write(bundle)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return nil, fmt.Errorf("write the egress CA bundle: %w", err)
	}
	env := make([]string, 0, len(trustVars))
	for _, v := range trustVars {
		env = append(env, v+"="+path)
	}
	return env, nil
}
