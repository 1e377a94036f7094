package main

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/app"
	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/k8srender"
	"github.com/corral-dev/corral/internal/sandbox/seccomp"
)

// k8sCmd is `corral k8s render`: the manifests that run Corral in a
// cluster, from the configuration, on stdout; and `corral k8s seccomp`:
// the seccomp profile to install on its nodes.
func k8sCmd() *cobra.Command {
	return groupCmd("k8s", "Kubernetes manifests and the nodes' seccomp profile", k8sRenderCmd(), k8sSeccompCmd())
}

// k8sSeccompCmd prints Corral's seccomp profile, for each node's kubelet
// seccomp directory (kubernetes.seccomp_profile names it there); with
// --gvisor, the form runsc --oci-seccomp can apply.
func k8sSeccompCmd() *cobra.Command {
	var (
		gvisor bool
		arch   string
	)
	cmd := &cobra.Command{
		Use:   "seccomp [--gvisor] [--arch amd64|arm64] > corral.json",
		Short: "The seccomp profile to install on the nodes",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			profile := seccomp.OCIProfile
			if gvisor {
				profile = seccomp.GVisorOCIProfile
			}
			p, err := profile(arch)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), p)
			return err
		},
	}
	cmd.Flags().BoolVar(&gvisor, "gvisor", false, "the form runsc --oci-seccomp applies (a gVisor RuntimeClass)")
	cmd.Flags().StringVar(&arch, "arch", runtime.GOARCH, "the nodes' architecture: "+strings.Join(seccomp.OCIArches, " or "))
	cmd.RegisterFlagCompletionFunc("arch", cobra.FixedCompletions(seccomp.OCIArches, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func k8sRenderCmd() *cobra.Command {
	var (
		lo   config.LoadOptions
		opts k8srender.Options
	)
	cmd := &cobra.Command{
		Use:   "render [flags] > corral.yaml",
		Short: "The manifests that run the server and its workers in a cluster, on stdout",
		Long: `Writes the manifests that run Corral in a Kubernetes cluster to stdout, from the
configuration: the server (corral serve on the kubernetes runtime) and what its
workers need. The stream opens with what to edit before ` + "`kubectl apply -f`" + `.`,
		Args: noArgs,
	}
	gfs := flag.NewFlagSet("render", flag.ContinueOnError)
	lo.RegisterClientFlags(gfs)
	cmd.Flags().AddGoFlagSet(gfs)
	f := cmd.Flags()
	f.StringVar(&opts.ServerImage, "server-image", defaultServerImage(), "the server's image")
	f.StringVar(&opts.Storage, "storage", "10Gi", "size of the workspace claim (ai_worker_config.workspace_pvc)")
	f.StringVar(&opts.StorageClass, "storage-class", "", "storage class of the workspace claim, one that offers ReadWriteMany (default: the cluster's default class)")
	f.BoolVar(&opts.NoSecrets, "no-secrets", false, "leave out the Secret templates (to apply again once they are filled in)")
	f.IntVar(&opts.Replicas, "replicas", 0, "server replicas (default: 2 with store.driver postgres, else 1; more than 1 needs postgres)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
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
		_, err = cmd.OutOrStdout().Write(out)
		return err
	}
	return cmd
}

// notTag is what an image tag cannot hold.
var notTag = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

// defaultServerImage is corral:<this binary's version>, e.g. corral:v1.2.0,
// or corral:devel for a build from a checkout.
func defaultServerImage() string {
	v := strings.Fields(app.Version())[0]
	return "corral:" + notTag.ReplaceAllString(v, "-")
}
