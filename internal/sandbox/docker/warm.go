//go:build linux

package docker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/ids"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
	"github.com/corral-dev/corral/internal/sandbox/warmpool"
	"github.com/corral-dev/corral/internal/sandbox/warmstart"
)

// Warm containers (sandbox.Warmer), with the pools and the slots of
// package warmpool, as the host runtimes keep their warm sandboxes.
//
// A warm container is a container of a shape's Template, from the pool's
// image, made as a cold task's is (containerConfig: its user, capabilities,
// seccomp profile, read-only root, network, limits and OCI runtime),
// named after its warm id (warmpool.Prefix, this runtime's tag, a random
// part) and labelled labelWarm. Each per-task mount of the Template binds
// an empty slot directory, StateDir/warm/<instance>/<warm id>/<mount
// index>: the container holds nothing of any task. Its main process
// (warmShim, then the Template's Command: `corral worker warm`) waits for
// its task's start on the container's stdin, which the server attached
// before the container started and holds (StdinOnce: the engine closes
// the stdin when the server's attachment ends, so the worker, and the
// container, end when the server dies: a warm container is never
// reattached). The worker acknowledges a start on the container's stdout
// (warmstart.Ack), which nothing else writes before it.
//
// A task whose spec fits a shape, of the pool's image, claims one
// (Create): its directories become the slots by rename (warmpool.HandOver)
// and are given to the container's identity; the claim is recorded
// (claimRecord: the engine cannot relabel a container, so the task's
// labels and directories are kept there); the identity's lease and then
// the container are renamed to the task's; the start goes down the
// stdin, which is then closed; and the acknowledgement read back is
// recorded. From then on the container is the task's sandbox, found by
// its name and destroyed after it like a cold one. A container is taken
// out of its pool before it is handed over, so no two tasks ever get the
// same one.
//
// A claimed container that ended without its worker's acknowledgement
// (neither in its record nor on its logged stdout: the server died between
// its rename and the start's write) ran nothing of its task, and says so
// (sandbox.ExitStatus.NotStarted).
//
// The first contact with the engine (Capabilities) destroys the warm
// containers that runtimes gone left (their tag's lock free), putting back
// a half-claimed task's entries (warmpool.DestroyLeftovers), and any
// unclaimed warm container of this instance that has ended.

var _ sandbox.Warmer = (*Runtime)(nil)

// labelWarm marks a container made warm; it stays once claimed (the
// engine's labels are fixed), when its name is the task's.
const labelWarm = "corral.warm"

// warmShim is a warm container's main process: /bin/sh with the
// Template's Command as its arguments. The start comes on stdin, as
// warmstart.FD; the acknowledgement goes to stdout, as warmstart.AckFD;
// the worker's own output goes to stderr.
const warmShim = `exec "$@" 5<&0 6>&1 1>&2 0<&-`

// ackWait bounds how long a claim waits for the worker's acknowledgement;
// one that comes later is read from the container's log at its end.
const ackWait = 10 * time.Second

// warmBox is a warm container in a pool.
type warmBox struct {
	id    string
	pool  *warmpool.Pool[*warmBox] // set when it is taken
	slots []string                 // the slot dirs, by mount index; "" for the others
	att   client.HijackedResponse  // the attachment to its stdin and stdout
	// imageEnv is its image's environment, which a cold container of the
	// task would have had under the task's.
	imageEnv []string
}

// claimRecord is what a claim keeps of the task's sandbox, at claimPath.
type claimRecord struct {
	Warm      string            `json:"warm"`
	Container string            `json:"container"`
	Labels    map[string]string `json:"labels,omitempty"`
	// Owned are the task's directories given to the container's identity.
	Owned []hostuser.Tree `json:"owned,omitempty"`
	// Acked: the worker acknowledged its start.
	Acked bool `json:"acked,omitempty"`
}

// warmDir holds the slots of this instance's warm containers and the
// records of their claims; it must be in the data root, which the
// containers' mounts are relative to.
func (r *Runtime) warmDir() string { return filepath.Join(r.opts.StateDir, "warm", r.opts.Instance) }

// claimPath is the claim record of sandbox id.
func (r *Runtime) claimPath(id string) string {
	return filepath.Join(r.warmDir(), "claimed", id+".json")
}

func (r *Runtime) readClaim(id string) (claimRecord, error) {
	var c claimRecord
	b, err := os.ReadFile(r.claimPath(id))
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	return c, err
}

func (r *Runtime) writeClaim(id string, c claimRecord) error { return writeRecord(r.claimPath(id), c) }

// imageOf is the image spec's container runs.
func (r *Runtime) imageOf(spec sandbox.Spec) string {
	if spec.Image != "" {
		return spec.Image
	}
	return r.opts.DefaultImage
}

// idOf is the sandbox id of a container named name with labels: a warm
// container's is its name's, which its claim changes.
func (r *Runtime) idOf(name string, labels map[string]string) string {
	if labels[labelWarm] != "true" {
		return labels[sandbox.LabelSandbox]
	}
	return strings.TrimPrefix(strings.TrimPrefix(name, "/"), r.name(""))
}

// labelsOf are the labels of sandbox id, whose container has labels: a
// claimed warm container's are its task's, from its claim record (none
// if it is unreadable).
func (r *Runtime) labelsOf(id string, labels map[string]string) map[string]string {
	if labels[labelWarm] != "true" || labels[sandbox.LabelSandbox] == id {
		return labels
	}
	c, err := r.readClaim(id)
	if err != nil {
		r.log.Warn("a claimed warm container has no readable claim record", logkey.SandboxID, id, logkey.Error, err)
		return nil
	}
	return c.Labels
}

// KeepWarm implements sandbox.Warmer: one pool per shape, each filled to
// p.Size within p's budget and refilled after every claim.
func (r *Runtime) KeepWarm(ctx context.Context, p sandbox.WarmPolicy) error {
	if p.Size <= 0 || len(p.Shapes) == 0 {
		return nil
	}
	if caps, _ := r.Capabilities(ctx); !caps.Available {
		return fmt.Errorf("keep containers warm: %s", caps.Reason)
	}
	if r.warmErr != nil {
		return fmt.Errorf("keep containers warm: %w", r.warmErr)
	}
	if rel, err := filepath.Rel(r.opts.DataRoot, r.warmDir()); err != nil || !filepath.IsLocal(rel) {
		return fmt.Errorf("keep containers warm: the state dir %s is not in the data root %s, which the containers' mounts are relative to", r.opts.StateDir, r.opts.DataRoot)
	}
	for _, sh := range p.Shapes {
		if err := warmpool.CheckShape(sh, r.opts.DataRoot, r.warmDir()); err != nil {
			return err
		}
	}
	return r.warm.Keep(ctx, p)
}

// WarmStats implements sandbox.Warmer.
func (r *Runtime) WarmStats() []sandbox.WarmStats { return r.warm.Stats() }

// claimWarm takes a warm container for spec out of its pool, or returns
// nil: for a spec no pool's shape fits or of another image than the
// pools', or when the pool has none ready (a miss, which has it fill).
func (r *Runtime) claimWarm(spec sandbox.Spec) *warmBox {
	if r.imageOf(spec) != r.opts.DefaultImage {
		return nil
	}
	pl, b, ok := r.warm.Take(spec)
	if !ok {
		return nil
	}
	b.pool = pl
	return b
}

// warmOps starts and destroys the runtime's warm containers for its pools.
type warmOps struct{ r *Runtime }

// StartWarm makes and starts a warm container of shape, attached to its
// stdin, with empty slots for its per-task mounts.
func (o warmOps) StartWarm(ctx context.Context, shape sandbox.WarmShape) (*warmBox, error) {
	r := o.r
	id := warmpool.Prefix + r.warmTag + "-" + ids.New()
	spec := shape.Template
	spec.ID = id
	spec.Image = r.imageOf(spec)
	spec.Labels = map[string]string{sandbox.LabelManaged: "true", labelWarm: "true"}
	spec.Command = append([]string{"/bin/sh", "-c", warmShim, "sh"}, spec.Command...)
	spec.Mounts = slices.Clone(spec.Mounts)
	root := filepath.Join(r.warmDir(), id)
	slots, err := warmpool.Slots(root, spec.Mounts)
	if err != nil {
		return nil, err
	}
	for i, slot := range slots {
		if slot != "" {
			rel, _ := filepath.Rel(r.opts.DataRoot, slot)
			spec.Mounts[i].Source = filepath.ToSlash(rel)
		}
	}
	if err := r.opts.User.ValidateSpec(spec, r.opts.DataRoot); err != nil {
		os.RemoveAll(root)
		return nil, fmt.Errorf("warm container: %w", err)
	}
	if err := r.ensureImage(ctx, spec.Image); err != nil {
		os.RemoveAll(root)
		return nil, fmt.Errorf("warm container: %w", err)
	}
	img, err := r.cli.ImageInspect(ctx, spec.Image)
	if err != nil {
		os.RemoveAll(root)
		return nil, classify("warm container: image "+spec.Image, err)
	}
	b := &warmBox{id: id, slots: slots}
	if img.Config != nil {
		b.imageEnv = img.Config.Env
	}
	_, att, err := r.create(ctx, spec, true)
	if err != nil {
		os.RemoveAll(root)
		return nil, err
	}
	b.att = *att
	return b, nil
}

// DestroyWarm destroys an unclaimed warm container and its slots.
func (o warmOps) DestroyWarm(ctx context.Context, b *warmBox) error {
	r := o.r
	b.att.Close() // its stdin closes: the worker ends, and the container
	if err := r.Destroy(ctx, b.id); err != nil {
		return fmt.Errorf("destroy warm container %s: %w", b.id, err)
	}
	os.RemoveAll(filepath.Join(r.warmDir(), b.id))
	return nil
}

// adopt hands spec's task (its id locked) to the warm container b. On an
// error before the start is sent b is destroyed, and the task's
// directories are where they were, their entries in them: the task can
// start cold.
func (r *Runtime) adopt(ctx context.Context, spec sandbox.Spec, b *warmBox) (*sandbox.Handle, error) {
	r.crash(sandbox.CrashClaimed)
	fail := func(what string, err error) (*sandbox.Handle, error) {
		b.pool.Destroy(context.WithoutCancel(ctx), b)
		return nil, fmt.Errorf("hand warm container %s to sandbox %s: %s: %w", b.id, spec.ID, what, err)
	}
	c, err := r.inspect(ctx, b.id)
	if err != nil {
		return fail("its container", err)
	}
	if !c.State.Running {
		return fail("its container", errors.New("has ended"))
	}
	resolved := spec.Resolve(r.opts.DataRoot)
	root := filepath.Join(r.warmDir(), b.id)
	if err := warmpool.HandOver(root, b.slots, resolved); err != nil {
		return fail("its directories", err)
	}
	r.crash(sandbox.CrashMoved)
	// The task's directories are the slots now, its entries in them.
	user, err := r.opts.Identities.Take(b.id)
	if err != nil {
		return fail("its identity", err)
	}
	rec := claimRecord{Warm: b.id, Container: c.ID, Labels: spec.Labels}
	rec.Owned, err = hostuser.Give(hostuser.WritableDirs(resolved.Mounts), user)
	if err == nil {
		err = r.writeClaim(spec.ID, rec)
	}
	if err == nil {
		err = r.opts.Identities.Rename(b.id, spec.ID)
	}
	if err == nil {
		// From here the container is the task's sandbox.
		_, err = r.cli.ContainerRename(ctx, c.ID, client.ContainerRenameOptions{NewName: r.name(spec.ID)})
	}
	if err != nil {
		hostuser.Reclaim(rec.Owned)
		os.Remove(r.claimPath(spec.ID))
		return fail("hand it over", err)
	}
	// The claim's record in the slots goes once the container has the
	// task's name: nothing is left to put back.
	os.RemoveAll(root)
	r.crash(sandbox.CrashHandedOver)
	// The engine reads the stdin for its detach keys, control characters
	// that JSON never holds unescaped.
	err = warmstart.Send(b.att.Conn, warmstart.Start{Argv: spec.Command, Env: warmstart.Overlay(b.imageEnv, sandbox.DefaultEnv(spec.Env)), Dir: spec.Dir})
	if cerr := b.att.CloseWrite(); err == nil {
		err = cerr
	}
	if err != nil {
		b.att.Close()
		r.Destroy(context.WithoutCancel(ctx), spec.ID)
		return nil, fmt.Errorf("start the task in warm container %s: %w", b.id, err)
	}
	r.crash(sandbox.CrashSent)
	if acked(b.att) {
		rec.Acked = true
		if err := r.writeClaim(spec.ID, rec); err != nil {
			r.log.Warn("cannot record a warm container's acknowledgement; its log keeps it", logkey.SandboxID, spec.ID, logkey.Error, err)
		}
	}
	b.att.Close()
	r.log.Info("sandbox started", logkey.SandboxID, spec.ID, "container", c.ID[:12], "warm_id", b.id)
	return r.handle(spec.ID, c.ID, spec.Labels), nil
}

// errAcked stops the read of a worker's acknowledgement.
var errAcked = errors.New("acknowledged")

// ackWriter gathers the stdout of a warm container up to an
// acknowledgement's length.
type ackWriter struct{ b []byte }

func (w *ackWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	if len(w.b) >= len(warmstart.Ack) {
		return len(p), errAcked
	}
	return len(p), nil
}

// acked reads the worker's acknowledgement from its container's attached
// stdout, for up to ackWait.
func acked(att client.HijackedResponse) bool {
	att.Conn.SetReadDeadline(time.Now().Add(ackWait))
	var w ackWriter
	stdcopy.StdCopy(&w, io.Discard, att.Reader)
	return bytes.HasPrefix(w.b, []byte(warmstart.Ack))
}

// warmNotStarted reports whether c, an ended container, is a claimed warm
// container whose worker never acknowledged its task's start.
func (r *Runtime) warmNotStarted(ctx context.Context, c container.InspectResponse) bool {
	if c.Config == nil || c.Config.Labels[labelWarm] != "true" {
		return false
	}
	if rec, err := r.readClaim(r.idOf(c.Name, c.Config.Labels)); err == nil && rec.Acked {
		return false
	}
	// Nothing writes its stdout before the worker's acknowledgement.
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	logs, err := r.cli.ContainerLogs(ctx, c.ID, client.ContainerLogsOptions{ShowStdout: true})
	if err != nil {
		return false // unknown: its exit is taken for the task's
	}
	defer logs.Close()
	var out bytes.Buffer
	stdcopy.StdCopy(&out, io.Discard, io.LimitReader(logs, 1<<20))
	return !bytes.Contains(out.Bytes(), []byte(warmstart.Ack))
}

// destroyLeftoverWarm destroys the warm containers that runtimes gone left
// (warmpool.DestroyLeftovers, by their slots), and the unclaimed warm
// containers of this instance that have ended (whoever made them: no
// task will come to them).
func (r *Runtime) destroyLeftoverWarm(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	warmpool.DestroyLeftovers(ctx, r.warmDir(), r.warmDir(), r.warmTag, r.Destroy, func(string) error { return nil }, r.log)
	f := client.Filters{}
	f.Add("label", sandbox.LabelRuntime+"="+Name, sandbox.LabelInstance+"="+r.opts.Instance, labelWarm+"=true")
	f.Add("status", "exited", "dead") // not created: a warm container being started
	res, err := r.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		r.log.Warn("cannot list warm containers left by an earlier server", logkey.Error, err)
		return
	}
	for _, c := range res.Items {
		if len(c.Names) == 0 {
			continue
		}
		id := r.idOf(c.Names[0], c.Labels)
		if id != c.Labels[sandbox.LabelSandbox] || !strings.HasPrefix(id, warmpool.Prefix) {
			continue // claimed: a task's sandbox
		}
		if err := r.Destroy(ctx, id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			r.log.Warn("cannot destroy an ended warm container", logkey.SandboxID, id, logkey.Error, err)
		}
	}
}
