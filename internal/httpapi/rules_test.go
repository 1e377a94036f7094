package httpapi

import (
	"io"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/corral-dev/corral/internal/testenv"
)

// rulesDir holds the alerting rules shipped for /metrics and their tests.
const rulesDir = "../../deploy/prometheus"

// The alerting rules load in Prometheus, and each alert fires for the
// series of its test and stays quiet for the others (corral-rules.test.yml).
func TestAlertRules(t *testing.T) {
	promtool := testenv.RequireBinary(t, "promtool", "apt-get install -y --no-install-recommends prometheus")
	for _, args := range [][]string{
		{"check", "rules", "corral-rules.yml"},
		{"test", "rules", "corral-rules.test.yml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = rulesDir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// Every metric the alerting rules and their tests name is one /metrics
// writes, with the labels it writes, and every value of a label the code
// fixes (a task's status, a delivery's state) is one it writes: a metric
// renamed in the code fails here, not silently in Prometheus.
func TestAlertRulesUseExportedMetrics(t *testing.T) {
	hs := httptest.NewServer(newTestServer(&stats{}, Options{Token: "tok"}, slogTo(io.Discard)).Handler())
	t.Cleanup(hs.Close)
	code, body := call(t, "GET", hs.URL+"/metrics", "tok")
	if code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	written := exported(t, body)

	var rules struct {
		Groups []struct {
			Rules []struct{ Alert, Expr string }
		}
	}
	readYAML(t, "corral-rules.yml", &rules)
	var tests struct {
		Tests []struct {
			InputSeries []struct{ Series string } `yaml:"input_series"`
		}
	}
	readYAML(t, "corral-rules.test.yml", &tests)

	checked := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n := checkSelectors(t, written, r.Alert, r.Expr)
			if n == 0 {
				t.Errorf("alert %s names no corral_ metric: %s", r.Alert, r.Expr)
			}
			checked += n
		}
	}
	for _, tc := range tests.Tests {
		for _, s := range tc.InputSeries {
			checked += checkSelectors(t, written, "an input series of corral-rules.test.yml", s.Series)
		}
	}
	if checked < 10 {
		t.Errorf("checked %d selectors; the files did not parse as expected", checked)
	}
}

// freeLabels take values from the configuration, the runtime or the
// histogram's bounds, not from the code: only their names are checked.
// job and instance are Prometheus's own.
var freeLabels = []string{"le", "runtime", "shape", "agent"}

var (
	selectorRE = regexp.MustCompile(`\b(corral_[a-z0-9_]+)(?:\{([^}]*)\})?`)
	matcherRE  = regexp.MustCompile(`([a-zA-Z_]+)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	plainRE    = regexp.MustCompile(`^[a-z_]+$`)
)

// checkSelectors checks each corral_ selector of expr against what /metrics
// wrote (exported) and returns how many it checked.
func checkSelectors(t *testing.T, written map[string]map[string][]string, where, expr string) int {
	t.Helper()
	sels := selectorRE.FindAllStringSubmatch(expr, -1)
	for _, sel := range sels {
		name, labels := sel[1], written[sel[1]]
		if labels == nil {
			t.Errorf("%s: /metrics writes no %s", where, name)
			continue
		}
		for _, m := range matcherRE.FindAllStringSubmatch(sel[2], -1) {
			label, op, value := m[1], m[2], m[3]
			if label == "job" || label == "instance" {
				continue
			}
			values, ok := labels[label]
			if !ok {
				t.Errorf("%s: /metrics writes %s without a label %s", where, name, label)
				continue
			}
			if slices.Contains(freeLabels, label) || op == "!=" || op == "!~" {
				continue
			}
			want := []string{value}
			if op == "=~" {
				want = strings.Split(value, "|")
			}
			for _, v := range want {
				if !plainRE.MatchString(v) {
					t.Errorf("%s: %s{%s=~%q}: this test reads a regular expression only as plain values joined by |", where, name, label, value)
				} else if !slices.Contains(values, v) {
					t.Errorf("%s: /metrics writes %s with %s one of %q, not %q", where, name, label, values, v)
				}
			}
		}
	}
	return len(sels)
}

// exported reads a /metrics body: for each sample name, the values each of
// its labels takes.
func exported(t *testing.T, body string) map[string]map[string][]string {
	t.Helper()
	out := map[string]map[string][]string{}
	for line := range strings.Lines(body) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		series := line[:strings.LastIndexByte(line, ' ')]
		name, labels, _ := strings.Cut(series, "{")
		if out[name] == nil {
			out[name] = map[string][]string{}
		}
		for _, m := range matcherRE.FindAllStringSubmatch(labels, -1) {
			if !slices.Contains(out[name][m[1]], m[3]) {
				out[name][m[1]] = append(out[name][m[1]], m[3])
			}
		}
	}
	return out
}

func readYAML(t *testing.T, name string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(rulesDir, name))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}
