package projection

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/task"
)

// The checkpoint's encoding: varints, length-prefixed strings and a
// presence mark before each slice, map and pointer, so that nil and empty
// come back as they went (a task's JSON, and cmp, tell them apart). It is
// read from a string, so that the strings it holds are slices of it, not
// copies: 100,000 ended tasks held in part are read without allocating.

// errMalformed is what a reader reports for bytes it cannot make sense of.
var errMalformed = errors.New("malformed checkpoint")

// enc appends values to b.
type enc struct{ b []byte }

func (w *enc) uvarint(v uint64) { w.b = binary.AppendUvarint(w.b, v) }
func (w *enc) varint(v int64)   { w.b = binary.AppendVarint(w.b, v) }
func (w *enc) str(s string)     { w.uvarint(uint64(len(s))); w.b = append(w.b, s...) }
func (w *enc) f64(f float64)    { w.b = binary.LittleEndian.AppendUint64(w.b, math.Float64bits(f)) }
func (w *enc) u32(v uint32)     { w.b = binary.LittleEndian.AppendUint32(w.b, v) }

func (w *enc) bool(v bool) {
	if v {
		w.b = append(w.b, 1)
	} else {
		w.b = append(w.b, 0)
	}
}

// count writes n for a slice or map, or 0 for a nil one.
func (w *enc) count(n int, isNil bool) {
	if isNil {
		w.uvarint(0)
	} else {
		w.uvarint(uint64(n) + 1)
	}
}

// time writes t to the nanosecond with its offset from UTC (the name of
// its zone is lost: a time in Europe/Paris comes back in a zone of the
// same offset with no name). Every time a task holds is an event's
// recorded_at, which the stores give in UTC.
func (w *enc) time(t time.Time) {
	switch _, off := t.Zone(); {
	case t == time.Time{}:
		w.b = append(w.b, 0)
	case t.Location() == time.UTC:
		w.b = append(w.b, 1)
		w.varint(t.Unix())
		w.uvarint(uint64(t.Nanosecond()))
	default:
		w.b = append(w.b, 2)
		w.varint(t.Unix())
		w.uvarint(uint64(t.Nanosecond()))
		w.varint(int64(off))
	}
}

// dec reads what enc wrote from s. After the first error every read
// returns a zero value and err says what went wrong.
type dec struct {
	s   string
	err error
}

func (r *dec) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", errMalformed, what)
	}
	r.s = ""
}

func (r *dec) uvarint() uint64 {
	if len(r.s) > 0 && r.s[0] < 0x80 { // most are: lengths, counts, flags
		v := uint64(r.s[0])
		r.s = r.s[1:]
		return v
	}
	var v uint64
	for i, shift := 0, 0; i < len(r.s) && i < binary.MaxVarintLen64; i, shift = i+1, shift+7 {
		b := r.s[i]
		if b < 0x80 {
			r.s = r.s[i+1:]
			return v | uint64(b)<<shift
		}
		v |= uint64(b&0x7f) << shift
	}
	r.fail("bad varint")
	return 0
}

func (r *dec) varint() int64 {
	u := r.uvarint()
	return int64(u>>1) ^ -int64(u&1)
}

// take returns the next n bytes.
func (r *dec) take(n uint64) string {
	if n > uint64(len(r.s)) {
		r.fail("truncated")
		return ""
	}
	s := r.s[:n]
	r.s = r.s[n:]
	return s
}

func (r *dec) str() string { return r.take(r.uvarint()) }
func (r *dec) bool() bool  { return r.take(1) == "\x01" }

func (r *dec) f64() float64 {
	s := r.take(8)
	if len(s) < 8 {
		return 0
	}
	return math.Float64frombits(uint64(le32(s, 0)) | uint64(le32(s, 4))<<32)
}

func (r *dec) u32() uint32 {
	s := r.take(4)
	if len(s) < 4 {
		return 0
	}
	return le32(s, 0)
}

// n reads a number of elements that follow, each of a byte at least.
func (r *dec) n() int {
	n := r.uvarint()
	if n > uint64(len(r.s)) {
		r.fail("count past the end")
		return 0
	}
	return int(n)
}

// count reads what enc.count wrote: n, or isNil.
func (r *dec) count() (n int, isNil bool) {
	c := r.uvarint()
	if c == 0 {
		return 0, true
	}
	if c-1 > uint64(len(r.s)) { // every element takes a byte at least
		r.fail("count past the end")
		return 0, true
	}
	return int(c - 1), false
}

func (r *dec) time() time.Time {
	switch tag := r.take(1); tag {
	case "\x00":
		return time.Time{}
	case "\x01", "\x02":
		sec, nsec := r.varint(), r.uvarint()
		if nsec >= 1e9 {
			r.fail("bad time")
			return time.Time{}
		}
		t := time.Unix(sec, int64(nsec))
		if tag == "\x01" {
			return t.UTC()
		}
		return t.In(time.FixedZone("", int(r.varint())))
	}
	r.fail("bad time")
	return time.Time{}
}

// le32 is the little-endian uint32 at s[i:].
func le32(s string, i int) uint32 {
	return uint32(s[i]) | uint32(s[i+1])<<8 | uint32(s[i+2])<<16 | uint32(s[i+3])<<24
}

// optional writes a pointer: whether it is nil, and what it points to.
func optional[T any](w *enc, p *T, write func(*enc, T)) {
	w.bool(p != nil)
	if p != nil {
		write(w, *p)
	}
}

func readOptional[T any](r *dec, read func(*dec) T) *T {
	if !r.bool() {
		return nil
	}
	v := read(r)
	return &v
}

// list writes a slice, nil or not.
func list[T any](w *enc, s []T, write func(*enc, T)) {
	w.count(len(s), s == nil)
	for _, v := range s {
		write(w, v)
	}
}

func readList[T any](r *dec, read func(*dec) T) []T {
	n, isNil := r.count()
	if isNil {
		return nil
	}
	s := make([]T, n)
	for i := range s {
		s[i] = read(r)
	}
	return s
}

func (w *enc) strs(s []string) { list(w, s, (*enc).str) }
func (r *dec) strs() []string  { return readList(r, (*dec).str) }

func (w *enc) bytes(b []byte) {
	w.count(len(b), b == nil)
	w.b = append(w.b, b...)
}

// bytes is a copy: a task may not share the checkpoint's bytes.
func (r *dec) bytes() []byte {
	n, isNil := r.count()
	if isNil {
		return nil
	}
	return []byte(r.take(uint64(n)))
}

func (w *enc) int(v int) { w.varint(int64(v)) }
func (r *dec) int() int  { return int(r.varint()) }

// The task codec is written out, field by field, where reflection would
// follow task.Task by itself: it reads a task in 3 µs, this in under 1,
// and a start reads a thousand (BenchmarkStart). TestTaskCodec fails when
// a field of task.Task is missing here, at any depth; taskShape retires
// the checkpoints written before a field was added, without anyone
// bumping checkpointVersion.

func (w *enc) task(t *task.Task) {
	w.str(t.ID)
	w.spec(&t.Spec)
	w.str(string(t.Status))
	w.varint(t.Version)
	w.str(t.CorrelationID)
	w.str(t.LastEventID)
	w.str(t.PromptSHA256)
	w.str(t.Replica)
	w.str(t.SandboxName)
	w.bytes(t.Handle)
	w.time(t.CreatedAt)
	w.time(t.UpdatedAt)
	optional(w, t.QueuedAt, (*enc).time)
	optional(w, t.StartedAt, (*enc).time)
	optional(w, t.CompletedAt, (*enc).time)
	optional(w, t.DurationSeconds, (*enc).varint)
	optional(w, t.DurationMS, (*enc).varint)
	optional(w, t.ExitCode, (*enc).int)
	list(w, t.OutputFiles, func(w *enc, f task.OutputFile) {
		w.str(f.Name)
		w.varint(f.Size)
		w.str(f.Type)
	})
	w.int(t.OutputFilesTotal)
	w.str(t.OutputFilesNote)
	w.str(t.Summary)
	w.str(t.ErrorMessage)
	w.bool(t.CancelRequested)
	w.bool(t.LogsTruncated)
	w.str(t.SessionID)
	optional(w, t.Usage, func(w *enc, u task.Usage) {
		w.varint(u.InputTokens)
		w.varint(u.OutputTokens)
		w.varint(u.CacheReadTokens)
		w.varint(u.CacheCreationTokens)
	})
	w.f64(t.CostUSD)
	optional(w, t.Changes, func(w *enc, c task.Changes) {
		w.strs(c.Added)
		w.strs(c.Modified)
		w.strs(c.Deleted)
		list(w, c.Commits, func(w *enc, c task.Commit) {
			w.str(c.Hash)
			w.str(c.Subject)
		})
		w.bool(c.Truncated)
	})
	optional(w, t.WorkspaceGit, func(w *enc, g task.WorkspaceGit) {
		w.strs(g.Hooks)
		w.bool(g.HooksDisabled)
		w.strs(g.Config)
	})
	optional(w, t.SharedOutputs, func(w *enc, s task.SharedOutputs) {
		w.str(string(s.State))
		w.str(s.Directory)
		w.str(s.Error)
		w.str(s.After)
	})
	w.varint(t.QueueSeq)
	w.varint(t.Compactable)
}

func (w *enc) spec(s *task.Spec) {
	w.str(s.Kind)
	w.str(s.Description)
	w.strs(s.ContextFiles)
	w.strs(s.AttachmentIDs)
	w.str(s.Agent)
	w.str(s.Model)
	w.strs(s.Command)
	w.int(s.TimeoutMinutes)
	w.int(s.TimeoutSeconds)
	w.str(s.Runtime)
	w.str(s.Image)
	w.str(s.Network)
	w.strs(s.NetworkAllow)
	w.strs(s.Credentials)
	w.varint(s.Resources.MemoryBytes)
	w.varint(s.Resources.CPUMillis)
	w.varint(s.Resources.Pids)
	w.bool(s.SaveToShared)
	w.strs(s.DocumentIDs)
	w.str(s.NoteQuery)
	w.strs(s.NoteIDs)
	w.count(len(s.Labels), s.Labels == nil)
	for _, k := range slices.Sorted(maps.Keys(s.Labels)) { // the same task, the same bytes
		w.str(k)
		w.str(s.Labels[k])
	}
	w.str(s.IdempotencyKey)
	w.str(s.FollowUpOf)
	w.str(s.ExecSession)
	w.str(s.Workspace)
	w.str(s.ConversationID)
	w.str(s.InterfaceType)
	w.str(s.UserName)
	w.str(s.OriginWorkspace)
	w.str(s.OriginConversation)
}

func (r *dec) task() task.Task {
	t := task.Task{ID: r.str(), Spec: r.spec(), Status: task.Status(r.str()), Version: r.varint(), CorrelationID: r.str(),
		LastEventID: r.str(), PromptSHA256: r.str(), Replica: r.str(), SandboxName: r.str(), Handle: r.bytes(),
		CreatedAt: r.time(), UpdatedAt: r.time()}
	t.QueuedAt = readOptional(r, (*dec).time)
	t.StartedAt = readOptional(r, (*dec).time)
	t.CompletedAt = readOptional(r, (*dec).time)
	t.DurationSeconds = readOptional(r, (*dec).varint)
	t.DurationMS = readOptional(r, (*dec).varint)
	t.ExitCode = readOptional(r, (*dec).int)
	t.OutputFiles = readList(r, func(r *dec) task.OutputFile {
		return task.OutputFile{Name: r.str(), Size: r.varint(), Type: r.str()}
	})
	t.OutputFilesTotal = r.int()
	t.OutputFilesNote = r.str()
	t.Summary = r.str()
	t.ErrorMessage = r.str()
	t.CancelRequested = r.bool()
	t.LogsTruncated = r.bool()
	t.SessionID = r.str()
	t.Usage = readOptional(r, func(r *dec) task.Usage {
		return task.Usage{InputTokens: r.varint(), OutputTokens: r.varint(), CacheReadTokens: r.varint(), CacheCreationTokens: r.varint()}
	})
	t.CostUSD = r.f64()
	t.Changes = readOptional(r, func(r *dec) task.Changes {
		c := task.Changes{Added: r.strs(), Modified: r.strs(), Deleted: r.strs()}
		c.Commits = readList(r, func(r *dec) task.Commit { return task.Commit{Hash: r.str(), Subject: r.str()} })
		c.Truncated = r.bool()
		return c
	})
	t.WorkspaceGit = readOptional(r, func(r *dec) task.WorkspaceGit {
		return task.WorkspaceGit{Hooks: r.strs(), HooksDisabled: r.bool(), Config: r.strs()}
	})
	t.SharedOutputs = readOptional(r, func(r *dec) task.SharedOutputs {
		return task.SharedOutputs{State: task.SaveState(r.str()), Directory: r.str(), Error: r.str(), After: r.str()}
	})
	t.QueueSeq = r.varint()
	t.Compactable = r.varint()
	return t
}

func (r *dec) spec() task.Spec {
	s := task.Spec{Kind: r.str(), Description: r.str(), ContextFiles: r.strs(), AttachmentIDs: r.strs(), Agent: r.str(), Model: r.str(),
		Command: r.strs(), TimeoutMinutes: r.int(), TimeoutSeconds: r.int(), Runtime: r.str(), Image: r.str(), Network: r.str(),
		NetworkAllow: r.strs(), Credentials: r.strs(), Resources: task.Resources{MemoryBytes: r.varint(), CPUMillis: r.varint(), Pids: r.varint()}, SaveToShared: r.bool(),
		DocumentIDs: r.strs(), NoteQuery: r.str(), NoteIDs: r.strs()}
	if n, isNil := r.count(); !isNil {
		s.Labels = make(map[string]string, n)
		for range n {
			k := r.str()
			s.Labels[k] = r.str()
		}
	}
	s.IdempotencyKey, s.FollowUpOf, s.ExecSession, s.Workspace = r.str(), r.str(), r.str(), r.str()
	s.Origin = task.Origin{ConversationID: r.str(), InterfaceType: r.str(), UserName: r.str(), OriginWorkspace: r.str(), OriginConversation: r.str()}
	return s
}

// taskShape is a hash of task.Task's fields, their names and kinds, at
// every depth. A checkpoint of another shape is not read: a field added,
// renamed or retyped retires the checkpoints written before, whether or
// not anyone remembers checkpointVersion.
var taskShape = func() uint64 {
	var b strings.Builder
	shapeOf(reflect.TypeFor[task.Task](), &b)
	h := fnv.New64a()
	h.Write([]byte(b.String()))
	return h.Sum64()
}()

func shapeOf(t reflect.Type, b *strings.Builder) {
	switch t.Kind() {
	case reflect.Struct:
		b.WriteString(t.String() + "{")
		for f := range t.Fields() {
			b.WriteString(f.Name + " ")
			shapeOf(f.Type, b)
			b.WriteString(";")
		}
		b.WriteString("}")
	case reflect.Pointer, reflect.Slice:
		b.WriteString(t.Kind().String() + " ")
		shapeOf(t.Elem(), b)
	case reflect.Map:
		b.WriteString("map ")
		shapeOf(t.Key(), b)
		shapeOf(t.Elem(), b)
	default:
		b.WriteString(t.Kind().String())
	}
}
