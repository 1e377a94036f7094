package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/k8srender"
	"github.com/corral-dev/corral/internal/sandbox/seccomp"
	"github.com/corral-dev/corral/internal/version"
)

const k8sUsage = "corral k8s render [--config FILE] [--server-image IMG] [--storage 10Gi] [--storage-class NAME] [--no-secrets] > corral.yaml\n       corral k8s seccomp [--gvisor] [--arch amd64|arm64] > corral.json"

// cmdK8s is `corral k8s render`: the manifests that run Corral in a
// cluster, from the configuration, on stdout; and `corral k8s seccomp`:
// the seccomp profile to install on its nodes.
func cmdK8s(_ context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: %s: %w", k8sUsage, errdefs.ErrInvalidArgument)
	}
	if isHelp(args[0]) {
		fmt.Fprintln(stdout, "usage: "+k8sUsage)
		return nil
	}
	if args[0] == "seccomp" {
		// Corral's seccomp profile, for each node's kubelet seccomp
		// directory (kubernetes.seccomp_profile names it there); with
		// --gvisor, the form runsc --oci-seccomp can apply.
		fs := flag.NewFlagSet("k8s seccomp", flag.ContinueOnError)
		fs.SetOutput(stderr)
		gvisor := fs.Bool("gvisor", false, "the form runsc --oci-seccomp applies (a gVisor RuntimeClass)")
		arch := fs.String("arch", runtime.GOARCH, "the nodes' architecture: "+strings.Join(seccomp.OCIArches, " or "))
		if err := parseNoArgs(fs, args[1:]); err != nil {
			return err
		}
		profile := seccomp.OCIProfile
		if *gvisor {
			profile = seccomp.GVisorOCIProfile
		}
		p, err := profile(*arch)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(stdout, p)
		return err
	}
	if args[0] != "render" {
		return fmt.Errorf("unknown k8s command %q; usage: %s: %w", args[0], k8sUsage, errdefs.ErrInvalidArgument)
	}
	fs := flag.NewFlagSet("k8s render", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: %s\n\n", k8sUsage)
		fmt.Fprintln(stderr, "Writes the manifests that run Corral in a Kubernetes cluster to stdout, from the configuration: the server (corral serve on the kubernetes runtime) and what its workers need. The stream opens with what to edit before `kubectl apply -f`.")
		fmt.Fprintln(stderr)
		fs.PrintDefaults()
	}
	var lo config.LoadOptions
	lo.RegisterClientFlags(fs)
	var opts k8srender.Options
	fs.StringVar(&opts.ServerImage, "server-image", defaultServerImage(), "the server's image")
	fs.StringVar(&opts.Storage, "storage", "10Gi", "size of the workspace claim (ai_worker_config.workspace_pvc)")
	fs.StringVar(&opts.StorageClass, "storage-class", "", "storage class of the workspace claim, one that offers ReadWriteMany (default: the cluster's default class)")
	fs.BoolVar(&opts.NoSecrets, "no-secrets", false, "leave out the Secret templates (to apply again once they are filled in)")
	fs.IntVar(&opts.Replicas, "replicas", 0, "server replicas (default: 2 with store.driver postgres, else 1; more than 1 needs postgres)")
	if err := parseNoArgs(fs, args[1:]); err != nil {
		return err
	}
	cfg, err := config.Load(lo)
	if err != nil {
		// The cluster's servers read the store's connection string from
		// their Secret (k8srender.StoreDSNKey), and rendering needs none: a
		// stand-in meets store.driver postgres's check, never rendered.
		stand := lo
		if stand.Environ == nil {
			stand.Environ = os.Environ()
		}
		stand.Environ = append(slices.Clone(stand.Environ), "CORRAL_STORE_DSN="+config.Placeholder)
		if c, serr := config.Load(stand); serr == nil && c.Store.Driver == config.StorePostgres && c.Store.DSNFile == "" {
			cfg, err = c, nil
		}
	}
	if err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	if f := cfg.File(); f != "" {
		opts.Source = f
	}
	out, err := k8srender.Render(cfg, opts)
	if err != nil {
		return err
	}
	_, err = stdout.Write(out)
	return err
}

// notTag is what an image tag cannot hold.
var notTag = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

// defaultServerImage is corral:<this binary's version>, e.g. corral:v1.2.0,
// or corral:devel for a build from a checkout.
func defaultServerImage() string {
	v := strings.Fields(version.String())[0]
	return "corral:" + notTag.ReplaceAllString(v, "-")
}
