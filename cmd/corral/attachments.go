package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/termsafe"
)

// cmdAttachments is `corral attachments get ID [-o FILE]` and
// `corral attachments put FILE...`.
func cmdAttachments(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const usage = "usage: corral attachments get ID [-o FILE] | put FILE..."
	if len(args) > 0 && isHelp(args[0]) {
		fmt.Fprintln(stdout, usage)
		return nil
	}
	if len(args) == 0 || (args[0] != "get" && args[0] != "put") {
		fmt.Fprintln(stderr, usage)
		return exitError(2)
	}
	fs, cf := clientFlagSet("attachments "+args[0], stderr)
	out := fs.String("o", "", "write the attachment to FILE (default: its original name in the current directory; - for stdout: the exact bytes, control characters escaped if stdout is a terminal)")
	pos, err := parse(fs, args[1:])
	if err != nil {
		return flagError(err)
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	if args[0] == "put" {
		if len(pos) == 0 {
			return fmt.Errorf("give one or more files: corral attachments put FILE...: %w", errdefs.ErrInvalidArgument)
		}
		atts, err := upload(ctx, c, pos)
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(stdout, atts)
		}
		for _, a := range atts {
			fmt.Fprintf(stdout, "%s %s %d %s\n", a.ID, termsafe.Name(a.Name), a.Size, termsafe.Line(a.Type))
		}
		return nil
	}
	if len(pos) != 1 {
		return fmt.Errorf("give one attachment id: corral attachments get ID [-o FILE]: %w", errdefs.ErrInvalidArgument)
	}
	m, rc, err := c.OpenAttachment(ctx, pos[0])
	if err != nil {
		return err
	}
	defer rc.Close()
	dst := *out
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
	if errors.Is(err, os.ErrExist) && *out != "" {
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
	if cf.json {
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
