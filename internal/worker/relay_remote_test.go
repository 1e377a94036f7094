package worker

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/egress"
)

// A pod's relay reaches the task's proxy over TCP with the task's key, and
// the proxy's policy applies; a relay with another key gets nowhere.
func TestRelayOverTCP(t *testing.T) {
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "reached") }))
	defer site.Close()
	siteURL, _ := url.Parse(site.URL)

	srv, err := egress.NewServer(t.TempDir(), egress.Options{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	if _, err := srv.Open("task-a", egress.Policy{Allow: egress.MustParseRules(siteURL.Host)}); err != nil {
		t.Fatal(err)
	}
	key := []byte("the key of task-a, 32 bytes long")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go srv.ServeTCP(ln, func(id string) []byte {
		if id == "task-a" {
			return key
		}
		return nil
	}, nil)

	get := func(up Upstream) (string, error) {
		relay, err := StartRelay("127.0.0.1:0", up, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer relay.Close()
		proxy, _ := url.Parse("http://" + relay.Addr())
		c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}}
		resp, err := c.Get(site.URL)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.Status + " " + string(b), nil
	}
	if got, err := get(TCPUpstream(ln.Addr().String(), "task-a", key)); err != nil || got != "200 OK reached" {
		t.Errorf("through the relay: %q, %v", got, err)
	}
	if got, err := get(TCPUpstream(ln.Addr().String(), "task-a", []byte("not the key of task-a, but 32 b."))); err == nil && strings.Contains(got, "reached") {
		t.Errorf("a wrong key reached the site: %q", got)
	}
}
