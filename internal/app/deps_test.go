package app_test

import (
	"encoding/json"
	"go/doc"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/corral-dev/corral/"

// allowed is Corral's import table (STYLE.md "Package layout"): the
// internal packages each package may import directly. A package missing
// from the table fails the test, so a new package must be placed in it.
var allowed = map[string][]string{
	"internal/errdefs": {},
	// This binary's version, stamped at link time by scripts/release.sh.
	"internal/version":    {},
	"internal/logkey":     {},
	"internal/ids":        {},
	"internal/units":      {},
	"internal/rtkind":     {},
	"internal/clip":       {},
	"internal/strictjson": {"errdefs"},
	"internal/testenv":    {},
	"internal/quota":      {},
	"internal/lockfile":   {"errdefs"},
	"internal/cluster":    {},
	"internal/task":       {"eventstore", "errdefs", "ids", "clip"},
	// sandbox/warmstart: its Overlay is DefaultEnv's merge of defaults under a spec's Env.
	"internal/sandbox":              {"errdefs", "clip", "sandbox/warmstart"},
	"internal/workspace":            {"errdefs", "filetype", "clip", "units"},
	"internal/filetype":             {},
	"internal/attachment":           {"errdefs", "units", "filetype", "workspace"},
	"internal/document":             {"eventstore", "task", "errdefs", "ids", "workspace", "clip"},
	"internal/skill":                {"errdefs", "clip"},
	"internal/config":               {"errdefs", "units", "task", "rtkind", "egress"}, // egress: a credential rule is checked as the proxy reads it
	"internal/eventstore":           {"errdefs", "ids"},
	"internal/eventstore/sqlite":    {"eventstore", "task", "errdefs", "ids", "logkey", "lockfile"},
	"internal/eventstore/postgres":  {"eventstore", "errdefs", "ids", "logkey", "cluster"},
	"internal/eventstore/storetest": {"eventstore", "task", "errdefs", "testenv"},
	// A PostgreSQL database of a test's own.
	"internal/eventstore/postgres/postgrestest": {"testenv"},
	// Test helpers: a store in a temporary directory; a store, its
	// projection and a data root.
	"internal/eventstore/sqlite/sqlitetest": {"eventstore/sqlite"},
	"internal/projection/projectiontest":    {"eventstore", "eventstore/sqlite", "eventstore/sqlite/sqlitetest", "projection", "task", "workspace"},
	"internal/sandbox/local":                {"sandbox", "sandbox/seccomp", "sandbox/cgroups", "sandbox/hostproc", "sandbox/guestetc", "sandbox/statedir", "sandbox/hostuser", "sandbox/warmpool", "errdefs", "logkey"},
	"internal/sandbox/gvisor":               {"sandbox", "sandbox/seccomp", "sandbox/cgroups", "sandbox/hostproc", "sandbox/guestetc", "sandbox/statedir", "sandbox/hostuser", "sandbox/warmpool", "errdefs", "logkey"},
	"internal/sandbox/sandboxtest":          {"sandbox", "sandbox/hostproc", "errdefs", "testenv"},
	"internal/sandbox/docker":               {"sandbox", "sandbox/cgroups", "sandbox/hostproc", "sandbox/hostuser", "sandbox/gvisor", "sandbox/seccomp", "sandbox/statedir", "sandbox/warmpool", "sandbox/warmstart", "ids", "lockfile", "errdefs", "logkey"}, // warmpool, warmstart, ids, lockfile: warm containers, as gvisor's
	"internal/sandbox/kubernetes":           {"sandbox", "sandbox/hostuser", "sandbox/warmpool", "sandbox/warmstart", "workerproto", "errdefs", "logkey"},                                                                                                     // workerproto: the variables a warm pod polls the server with
	"internal/sandbox/kubernetes/k8stest":   {"testenv", "sandbox/seccomp"},
	// corral store copy: the log from one store into the other, which it
	// opens (the one package besides app that names both).
	"internal/storecopy": {"eventstore", "eventstore/sqlite", "eventstore/postgres", "errdefs", "lockfile"},
	// corral k8s render: manifests from the whole configuration, as app
	// builds the server from it.
	"internal/k8srender":           {"config", "errdefs", "sandbox/kubernetes"},
	"internal/webui":               {},
	"internal/agent/agenttest":     {},
	"internal/agent":               {"errdefs"},
	"internal/webhook":             {"task", "errdefs", "strictjson", "rtkind"},
	"internal/notify":              {"eventstore", "task", "errdefs", "logkey", "clip"},
	"internal/egress":              {"errdefs", "logkey"},
	"internal/connlimit":           {"sandbox/hostproc"},
	"internal/worker":              {"errdefs", "workspace", "webhook", "agent", "logkey", "task", "workerproto", "egress"},
	"internal/workerproto":         {"errdefs", "workspace", "task", "rtkind"},
	"internal/projection":          {"eventstore", "task", "errdefs", "logkey"},
	"internal/scheduler":           {"task", "sandbox", "eventstore", "projection", "errdefs", "logkey", "cluster"},
	"internal/orchestrator":        {"task", "rtkind", "eventstore", "projection", "workspace", "errdefs", "logkey", "units", "clip", "service", "library", "workerproto"},
	"internal/service":             {"task", "eventstore", "workspace", "attachment", "document", "skill", "units", "clip", "errdefs"},
	"internal/service/servicetest": {"service", "eventstore", "task", "errdefs"},
	// The task and library use cases over a real store, for the tests of
	// what serves them.
	"internal/orchestrator/orchestratortest": {"orchestrator", "library", "service", "eventstore", "projection", "projection/projectiontest", "attachment", "workspace", "task", "workerproto"},
	"internal/library":                       {"task", "eventstore", "projection", "workspace", "attachment", "document", "skill", "errdefs", "units", "clip", "service", "workerproto"},
	"internal/taskrun":                       {"task", "sandbox", "placement", "eventstore", "projection", "workspace", "errdefs", "logkey", "units", "clip", "webhook", "workerproto", "quota", "session"},
	"internal/tools":                         {"service", "rtkind", "errdefs", "workspace", "strictjson"},
	"internal/httpapi":                       {"tools", "service", "task", "errdefs", "ids", "logkey", "eventstore", "workspace", "strictjson", "webhook", "execagent", "clip", "filetype", "webui"},
	// The OpenAPI document's schemas, for the tests that check real
	// answers against them.
	"internal/httpapi/openapitest": {"httpapi"},
	"internal/session":             {"sandbox", "placement", "rtkind", "eventstore", "task", "workspace", "workerproto", "errdefs", "ids", "clip", "service", "execagent", "execlog", "library", "cluster"},
	"internal/execagent":           {"errdefs", "clip"},
	"internal/execlog":             {},
	// Each runtime's record and the mounts every sandbox starts from.
	"internal/placement":               {"sandbox", "rtkind", "workerproto", "workspace"},
	"internal/execagent/execagenttest": {"execagent"},
	"internal/report":                  {"eventstore", "projection", "task"},
	"internal/mcpserver":               {"tools", "service", "task", "errdefs", "logkey", "eventstore"},
	"internal/app":                     {"*"},
	"internal/e2e":                     {}, // end-to-end suites: tests only
	// sandbox/gvisor: the bare runsc runs on the platform the runtime picks.
	"internal/bench": {"app", "config", "errdefs", "eventstore", "eventstore/postgres", "eventstore/sqlite", "httpapi", "rtkind", "sandbox/gvisor", "service", "task", "testenv"},
	"cmd/corral":     {"app", "version", "bench", "config", "errdefs", "httpapi", "k8srender", "mcpserver", "notify", "sandbox/seccomp", "service", "task", "eventstore", "termsafe", "tools", "workercmd", "storecopy", "rtkind", "workspace"}, // rtkind: --runtime completes and checks the runtimes' names; workspace: ws ls prints its entries
	// What every sandbox runs, and nothing of the server (badDeps).
	"internal/workercmd": {"worker", "execagent", "sandbox/warmstart", "workerproto"},
	"cmd/corral-worker":  {"workercmd"},
	"internal/termsafe":  {},

	// The seccomp filter of local sandboxes, and the escape tests' probe
	// (which looks for the worker's secrets by their names, and tries the
	// egress listener's handshake as another task or session).
	"internal/sandbox/seccomp":           {"errdefs"},
	"internal/sandbox/sandboxtest/probe": {"workerproto", "connlimit", "egress"},

	// What the host runtimes (local, gvisor) share: their cgroups, the
	// /proc helpers, the minimal /etc they generate, their state dir, the
	// host identity sandboxes run as.
	"internal/sandbox/cgroups":  {"sandbox", "errdefs"},
	"internal/sandbox/hostproc": {},
	"internal/sandbox/guestetc": {},
	"internal/sandbox/statedir": {"sandbox", "sandbox/cgroups", "sandbox/hostuser", "sandbox/hostproc", "errdefs", "logkey"},
	"internal/sandbox/hostuser": {"sandbox", "errdefs"},
	// How a warm sandbox's main process gets its task.
	"internal/sandbox/warmstart": {},
	// The warm pools' runtime-independent part (fill, refill, idle,
	// budget), shared by the runtimes that keep sandboxes warm; and the
	// host runtimes' warm claim (Host): over their state dir (statedir),
	// giving the task's directories to the sandbox identity (hostuser),
	// sending the start (warmstart), naming a warm sandbox (ids).
	"internal/sandbox/warmpool": {"sandbox", "sandbox/statedir", "sandbox/hostuser", "sandbox/warmstart", "ids", "errdefs", "logkey", "lockfile", "quota"},
}

// badDeps are modules some packages must not depend on even indirectly:
// the scheduler, the orchestrator and the transports know runtimes and
// stores only by their interfaces, and the transports know the use cases
// only by the service contract (not the orchestrator, the in-sandbox
// worker or the agent adapters).
var badDeps = map[string][]string{
	"internal/scheduler":    {"internal/sandbox/local", "internal/eventstore/sqlite", "modernc.org/sqlite", "golang.org/x/sys/unix", "github.com/moby/moby/client", "k8s.io/client-go"},
	"internal/orchestrator": {"internal/sandbox/local", "internal/eventstore/sqlite", "modernc.org/sqlite", "github.com/moby/moby/client", "k8s.io/client-go", "internal/worker", "internal/agent", "internal/sandbox", "internal/taskrun"},
	"internal/library":      {"internal/sandbox", "internal/scheduler", "internal/worker", "internal/agent", "internal/eventstore/sqlite", "modernc.org/sqlite"},
	"internal/taskrun":      {"internal/orchestrator", "internal/worker", "internal/agent", "internal/eventstore/sqlite", "modernc.org/sqlite", "internal/sandbox/local", "internal/sandbox/gvisor", "internal/sandbox/docker", "internal/sandbox/kubernetes", "github.com/moby/moby/client", "k8s.io/client-go"},
	"internal/worker":       {"k8s.io/client-go", "github.com/moby/moby/client", "modernc.org/sqlite"},
	// corral-worker starts in every sandbox and idles in every warm one:
	// what it links is what each of them pays for.
	"cmd/corral-worker":  {"k8s.io", "github.com/moby", "github.com/distribution", "modernc.org/sqlite", "github.com/modelcontextprotocol/go-sdk", "internal/app", "internal/httpapi", "internal/eventstore/sqlite", "internal/orchestrator", "internal/sandbox/local", "internal/webui"},
	"internal/document":  {"internal/eventstore/sqlite", "modernc.org/sqlite"},
	"internal/httpapi":   {"internal/sandbox/local", "internal/eventstore/sqlite", "internal/scheduler", "modernc.org/sqlite", "github.com/moby/moby/client", "k8s.io/client-go", "github.com/modelcontextprotocol/go-sdk", "internal/orchestrator", "internal/worker", "internal/agent", "internal/session", "internal/taskrun", "internal/library"},
	"internal/mcpserver": {"internal/sandbox/local", "internal/eventstore/sqlite", "internal/scheduler", "modernc.org/sqlite", "internal/orchestrator", "internal/worker", "internal/agent"},
	"internal/tools":     {"internal/sandbox/local", "internal/eventstore/sqlite", "modernc.org/sqlite", "internal/orchestrator", "internal/worker", "internal/agent"},
	"internal/notify":    {"internal/sandbox/local", "internal/eventstore/sqlite", "internal/scheduler", "modernc.org/sqlite"},
}

type pkg struct {
	ImportPath string
	Dir        string
	Imports    []string
	Deps       []string
	GoFiles    []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	out, err := exec.Command("go", "list", "-json", "-deps=false", module+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	var pkgs []pkg
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func TestImportTable(t *testing.T) {
	for _, p := range listPackages(t) {
		name := strings.TrimPrefix(p.ImportPath, module)
		ok, known := allowed[name]
		if !known {
			t.Errorf("%s is not in the import table; add it to allowed in deps_test.go (and STYLE's table)", name)
			continue
		}
		if slices.Contains(ok, "*") {
			continue
		}
		for _, imp := range p.Imports {
			rel, isOurs := strings.CutPrefix(imp, module+"internal/")
			if isOurs && !slices.Contains(ok, rel) {
				t.Errorf("%s imports internal/%s, which the import table does not allow", name, rel)
			}
		}
		for _, bad := range badDeps[name] {
			for _, d := range p.Deps {
				if d == bad || d == module+bad || strings.HasPrefix(d, bad+"/") {
					t.Errorf("%s depends on %s", name, d)
				}
			}
		}
	}
}

// TestPackageDocs checks that every package has a doc comment.
func TestPackageDocs(t *testing.T) {
	for _, p := range listPackages(t) {
		fset := token.NewFileSet()
		var files []string
		for _, f := range p.GoFiles {
			files = append(files, filepath.Join(p.Dir, f))
		}
		var synopsis string
		for _, f := range files {
			af, err := parser.ParseFile(fset, f, nil, parser.ParseComments|parser.PackageClauseOnly)
			if err != nil {
				t.Fatal(err)
			}
			if af.Doc != nil {
				synopsis = doc.Synopsis(af.Doc.Text())
			}
		}
		if synopsis == "" {
			t.Errorf("%s has no package doc comment", p.ImportPath)
		}
	}
}
