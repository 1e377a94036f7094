package cluster

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// A view is steady only after a TTL of renewals without a gap, holds its
// lease while its last renewal is recent, and tells a change of the live
// set to whoever waits on it.
func TestView(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var v View
		if v.Steady() || v.Holding() {
			t.Fatal("steady or holding before any renewal")
		}
		a := map[string]Replica{"r-a": {ID: "r-a"}}
		changed := v.Changed()
		v.Renewed(time.Now(), a)
		select {
		case <-changed:
		default:
			t.Error("the first live set was not told")
		}
		if !v.Holding() || v.Steady() {
			t.Errorf("after one renewal: holding %v, steady %v; want holding, not steady", v.Holding(), v.Steady())
		}
		for range 3 {
			time.Sleep(Renew)
			v.Renewed(time.Now(), a)
		}
		if !v.Steady() {
			t.Error("not steady after a TTL of renewals")
		}
		changed = v.Changed()
		v.Renewed(time.Now(), a)
		select {
		case <-changed:
			t.Error("an unchanged live set was told")
		default:
		}
		v.Failed()
		if v.Steady() {
			t.Error("steady right after a failed renewal")
		}
		v.Renewed(time.Now(), a)
		if v.Steady() {
			t.Error("steady right after a gap")
		}
		time.Sleep(3 * Renew) // a renewal that hangs
		if v.Holding() || v.Steady() {
			t.Error("holding or steady with no renewal for three Renews")
		}
	})
}

// Solo is one replica, alive, steady and leading.
func TestSolo(t *testing.T) {
	s := NewSolo(Replica{ID: NewID()})
	if !strings.HasPrefix(s.Self(), "r-") || len(s.Self()) != 12 {
		t.Errorf("id %q, want r- and ten characters", s.Self())
	}
	if _, ok := s.Live()[s.Self()]; !ok || len(s.Live()) != 1 || !s.Steady() || !s.Holding() {
		t.Errorf("solo: live %v, steady %v, holding %v", s.Live(), s.Steady(), s.Holding())
	}
	ctx, cancel := context.WithCancel(context.Background())
	led := false
	cancel()
	s.Lead(ctx, func(context.Context) { led = true })
	if !led {
		t.Error("a server alone does not lead")
	}
}
