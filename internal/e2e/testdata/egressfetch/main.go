// Command egressfetch is built by internal/app's egress test and run inside
// a sandbox as a command agent. It runs the steps its arguments name, in
// order, and writes what each found to output/result.json:
//
//	env                 the proxy variables the agent got
//	stat PATH           whether PATH exists
//	get URL             a GET through HTTP_PROXY (plain HTTP forwarding), direct without one
//	connect HOST:PORT   a CONNECT through HTTP_PROXY, then GET /tunnel inside
//	dial HOST:PORT      a direct TCP connection, no proxy
//	wait FILE           wait up to 120s for FILE to exist
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

type result struct {
	Step   string `json:"step"`
	Arg    string `json:"arg"`
	OK     bool   `json:"ok"`
	Status int    `json:"status,omitempty"`
	Body   string `json:"body,omitempty"`
	Error  string `json:"error,omitempty"`
}

func main() {
	var out []result
	args := os.Args[1:]
	for i := 0; i < len(args); i++ {
		r := result{Step: args[i]}
		if args[i] != "env" {
			i++
			r.Arg = args[i]
		}
		run(&r)
		out = append(out, r)
	}
	b, _ := json.MarshalIndent(out, "", "  ")
	if err := os.WriteFile("output/result.json", b, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(r *result) {
	// Go's ProxyFromEnvironment never proxies loopback hosts, the only
	// ones a test here can serve: use HTTP_PROXY as it is.
	tr := &http.Transport{}
	if p, err := url.Parse(os.Getenv("HTTP_PROXY")); err == nil && p.Host != "" {
		tr.Proxy = http.ProxyURL(p)
	}
	client := &http.Client{Timeout: 20 * time.Second, Transport: tr}
	switch r.Step {
	case "env":
		var kv []string
		for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY"} {
			if v, ok := os.LookupEnv(k); ok {
				kv = append(kv, k+"="+v)
			}
		}
		r.Body, r.OK = strings.Join(kv, "\n"), len(kv) > 0
	case "stat":
		_, err := os.Stat(r.Arg)
		r.OK = err == nil
		if err != nil {
			r.Error = err.Error()
		}
	case "get", "direct":
		if r.Step == "direct" {
			// As a client honouring NO_PROXY reaches a loopback URL.
			client.Transport = &http.Transport{}
		}
		resp, err := client.Get(r.Arg)
		if err != nil {
			r.Error = err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		r.Status, r.Body, r.OK = resp.StatusCode, string(b), resp.StatusCode == 200
	case "connect":
		proxy := os.Getenv("HTTPS_PROXY")
		if proxy == "" {
			r.Error = "no HTTPS_PROXY"
			return
		}
		u, err := url.Parse(proxy)
		if err != nil {
			r.Error = err.Error()
			return
		}
		c, err := net.DialTimeout("tcp", u.Host, 10*time.Second)
		if err != nil {
			r.Error = err.Error()
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", r.Arg, r.Arg)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil {
			r.Error = err.Error()
			return
		}
		r.Status = resp.StatusCode
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			r.Body = string(b)
			return
		}
		fmt.Fprintf(c, "GET /tunnel HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", r.Arg)
		inner, err := http.ReadResponse(br, nil)
		if err != nil {
			r.Error = err.Error()
			return
		}
		b, _ := io.ReadAll(inner.Body)
		r.Body, r.OK = string(b), inner.StatusCode == 200
	case "dial":
		c, err := net.DialTimeout("tcp", r.Arg, 5*time.Second)
		if err != nil {
			r.Error = err.Error()
			return
		}
		c.Close()
		r.OK = true
	case "wait":
		deadline := time.Now().Add(120 * time.Second)
		for time.Now().Before(deadline) {
			if _, err := os.Stat(r.Arg); err == nil {
				r.OK = true
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		r.Error = "timed out"
	default:
		r.Error = "unknown step"
	}
}
