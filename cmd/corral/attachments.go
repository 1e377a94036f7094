package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/termsafe"
)

// attachmentsCmd is `corral attachments get ID [-o FILE]` and
// `corral attachments put FILE...`.
func attachmentsCmd() *cobra.Command {
	return groupCmd("attachments", "Download or upload attachments", attachmentsGetCmd(), attachmentsPutCmd())
}

func attachmentsPutCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "put FILE...",
		Short: "Upload files as attachments; prints their ids",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("give one or more files: corral attachments put FILE...")
			}
			return nil
		},
	}
	cf := clientCmd(cmd)
	out := outputFlags(cmd, objectFormats)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		format, err := out.get()
		if err != nil {
			return err
		}
		c, err := cf.client()
		if err != nil {
			return err
		}
		atts, err := upload(cmd.Context(), c, args)
		if err != nil {
			return err
		}
		stdout := cmd.OutOrStdout()
		return printAs(stdout, format, atts, func() error {
			for _, a := range atts {
				fmt.Fprintf(stdout, "%s %s %d %s\n", a.ID, termsafe.Name(a.Name), a.Size, termsafe.Line(a.Type))
			}
			return nil
		})
	}
	return cmd
}

// attachmentsGetCmd downloads an attachment. Its -o names the file to
// write, as curl's and docker save's do: the one -o that is not a format.
func attachmentsGetCmd() *cobra.Command {
	var (
		dst    string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "get ID [-o FILE]",
		Short: "Download an attachment",
		Args:  exactArgs(1, "one attachment id: corral attachments get ID [-o FILE]"),
	}
	cf := clientCmd(cmd)
	cmd.Flags().StringVarP(&dst, "output", "o", "", "write the attachment to FILE (default: its original name in the current directory; - for stdout: the exact bytes, control characters escaped if stdout is a terminal)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print what was written as JSON")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		return downloadAttachment(cmd.Context(), c, args[0], dst, asJSON, cmd.OutOrStdout())
	}
	return cmd
}

func downloadAttachment(ctx context.Context, c *httpapi.Client, id, named string, asJSON bool, stdout io.Writer) error {
	m, rc, err := c.OpenAttachment(ctx, id)
	if err != nil {
		return err
	}
	defer rc.Close()
	dst := named
	if dst == "" {
		dst = filepath.Base(m.Name)
		if dst == "." || dst == "/" || dst == "" {
			dst = m.ID
		}
	}
	if dst == "-" {
		w := termsafe.ForTerminal(stdout)
		_, err := io.Copy(w, rc)
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		return err
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if errors.Is(err, os.ErrExist) && named != "" {
		f, err = os.Create(dst) // named with -o: the caller asked for that file
	}
	if err != nil {
		return fileError("create", dst, err)
	}
	n, err := io.Copy(f, rc)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dst)
		return fmt.Errorf("download attachment %s: %w", m.ID, err)
	}
	if asJSON {
		return printJSON(stdout, map[string]any{"attachment": m, "path": dst, "bytes": n})
	}
	fmt.Fprintf(stdout, "%s (%d bytes)\n", termsafe.Name(dst), n)
	return nil
}

// upload sends files as attachments in one streaming request.
func upload(ctx context.Context, c service.Library, paths []string) ([]service.Attachment, error) {
	var open *os.File
	defer func() {
		if open != nil {
			open.Close()
		}
	}()
	i := 0
	return c.UploadAttachments(ctx, func() (string, io.Reader, error) {
		if open != nil {
			open.Close()
			open = nil
		}
		if i == len(paths) {
			return "", nil, io.EOF
		}
		p := paths[i]
		i++
		f, err := os.Open(p)
		if err != nil {
			return "", nil, fmt.Errorf("%w: %w", fileError("open", p, err), errdefs.ErrInvalidArgument)
		}
		open = f
		return filepath.Base(p), f, nil
	})
}
