package quota

import (
	"os"
	"testing"
)

func TestProbeHere(t *testing.T) {
	_, err := Open(t.TempDir())
	t.Log(err)
	f, _ := os.Open(t.TempDir())
	id, err := Project(f)
	t.Log(id, err)
}
