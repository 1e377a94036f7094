// Package rtkind lists the runtimes Corral has, with what is true of each
// whatever the configuration: the one list of their names outside their
// own packages (internal/sandbox/...) and the server's constructor of them
// (internal/app). It imports nothing, so the use cases, the configuration
// and the tools' schemas know runtimes by it and not by the sandboxes.
package rtkind

// Kind is what is true of a runtime whatever the configuration.
type Kind struct {
	Name string
	// Images: a task or session on it runs in an image it names (or the
	// server's default), not in the host's file system.
	Images bool
	// Remote: its sandboxes run off this host and reach the server over
	// the network, not through its socket.
	Remote bool
}

// Kinds are the runtimes Corral has, in the order the docs list them: the
// one list of their names outside their own packages and the server's
// constructor of them (app).
var Kinds = []Kind{
	{Name: Local},
	{Name: GVisor},
	{Name: Docker, Images: true},
	{Name: Kubernetes, Images: true, Remote: true},
}

// The runtimes' names. Local is also the runtime of a configuration that
// names none, and the webhook source of a worker that says none.
const (
	Local      = "local"
	GVisor     = "gvisor"
	Docker     = "docker"
	Kubernetes = "kubernetes"
)

// Names are the names of Kinds, in order.
func Names() []string {
	names := make([]string, len(Kinds))
	for i, k := range Kinds {
		names[i] = k.Name
	}
	return names
}

// Of returns the kind named name; ok is false for no runtime's name.
func Of(name string) (k Kind, ok bool) {
	for _, k := range Kinds {
		if k.Name == name {
			return k, true
		}
	}
	return Kind{}, false
}

// RunsImages reports whether runtime runs a task or session in an image.
func RunsImages(runtime string) bool {
	for _, k := range Kinds {
		if k.Name == runtime {
			return k.Images
		}
	}
	return false
}
