package projection

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/task"
)

// fill sets every field of v, at every depth, to a value that is not its
// zero (ptrZero: every pointer, slice and map to a zero or empty one
// instead, which must not come back nil), with n making values differ.
func fill(v reflect.Value, n int, ptrZero bool) {
	if v.Type() == reflect.TypeFor[time.Time]() {
		at := time.Date(2026, 11, 29, 8, 0, n, n*1000+7, time.UTC)
		if n%2 == 1 {
			at = at.In(time.FixedZone("", 3600*n%43200))
		}
		v.Set(reflect.ValueOf(at))
		return
	}
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(-n - 1))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(n + 1))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(n) + 0.25)
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", n))
	case reflect.Slice:
		if ptrZero {
			v.Set(reflect.MakeSlice(v.Type(), 0, 0))
			return
		}
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			fill(s.Index(i), n+i, false)
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		if !ptrZero {
			for i := range 2 {
				k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
				fill(k, n+i, false)
				fill(e, n+i, false)
				m.SetMapIndex(k, e)
			}
		}
		v.Set(m)
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		if !ptrZero {
			fill(p.Elem(), n, false)
		}
		v.Set(p)
	case reflect.Struct:
		for i := range v.NumField() {
			fill(v.Field(i), n+i, ptrZero)
		}
	default:
		panic("fill: " + v.Kind().String())
	}
}

// TestTaskCodec: a task comes back from a checkpoint as it went in, every
// field of it, at every depth: one with every field set, one with every
// pointer, slice and map set to a zero or empty one (an exit code of 0,
// an empty label map), and the zero task. A field added to task.Task of
// a kind the codec cannot write fails here.
func TestTaskCodec(t *testing.T) {
	var full, zeros task.Task
	fill(reflect.ValueOf(&full).Elem(), 1, false)
	fill(reflect.ValueOf(&zeros).Elem(), 2, true)
	if full.ExitCode == nil || zeros.ExitCode == nil || *zeros.ExitCode != 0 || zeros.Labels == nil {
		t.Fatalf("fill left fields unset: %+v", zeros)
	}
	for name, in := range map[string]task.Task{"full": full, "pointers to zeros": zeros, "zero": {}} {
		var w enc
		w.task(&in)
		r := dec{s: string(w.b)}
		out := r.task()
		if r.err != nil || r.s != "" {
			t.Fatalf("%s: read back: %v, %d bytes left", name, r.err, len(r.s))
		}
		// reflect.DeepEqual tells nil from empty; cmp shows where. Times
		// compare with Equal: a zone's name is not kept, its offset is.
		if diff := cmp.Diff(in, out); diff != "" || !reflect.DeepEqual(withoutTimes(in), withoutTimes(out)) {
			t.Errorf("%s: round trip (-in +out):\n%s", name, diff)
		}
		for cut := range len(w.b) { // a truncated task is an error, never a panic
			r := dec{s: string(w.b[:cut])}
			r.task()
			if r.err == nil {
				t.Fatalf("%s: %d of %d bytes read without an error", name, cut, len(w.b))
			}
		}
	}
}

// withoutTimes is t with its times cleared, for reflect.DeepEqual.
func withoutTimes(t task.Task) task.Task {
	t.CreatedAt, t.UpdatedAt = time.Time{}, time.Time{}
	t.QueuedAt, t.StartedAt, t.CompletedAt = nil, nil, nil
	return t
}

// TestTaskShape: the shape that retires old checkpoints changes with
// task.Task's fields, at any depth, not with their values.
func TestTaskShape(t *testing.T) {
	shape := func(typ reflect.Type) string {
		var b strings.Builder
		shapeOf(typ, &b)
		return b.String()
	}
	type inner struct{ N int }
	type a struct {
		X string
		Y *inner
	}
	type b struct {
		X string
		Y *inner
		Z bool
	}
	type c struct {
		X string
		W *inner
	}
	type d struct {
		X string
		Y *struct{ N string }
	}
	for _, other := range []reflect.Type{reflect.TypeFor[b](), reflect.TypeFor[c](), reflect.TypeFor[d]()} {
		if shape(reflect.TypeFor[a]()) == shape(other) {
			t.Errorf("%s has the shape of %s: %q", other, reflect.TypeFor[a](), shape(other))
		}
	}
}
