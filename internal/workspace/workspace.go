// Package workspace owns Corral's data root on disk (SPEC §1) and every file
// operation on it. Each operation that takes a path from a caller or a worker
// goes through an *os.Root, which refuses "..", absolute paths and symlinks
// that leave the root when the file is opened — no check-then-open race.
package workspace

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
)

// ErrPathEscapes is returned for a path that would leave its root.
var ErrPathEscapes = fmt.Errorf("path escapes workspace: %w", errdefs.ErrPermissionDenied)

// ErrTooLarge is returned when a write or copy would pass a size limit.
var ErrTooLarge = errdefs.ErrTooLarge

// Clean checks a caller's path and returns it as a local, slash-separated
// path relative to its root ("" or "." for the root itself). A leading "/"
// or "/workspace/shared/" is taken as relative to the root, since that is how
// a worker and the seed's tools name shared files. NUL bytes, backslashes,
// ".." and anything else that is not local are refused with ErrPathEscapes,
// for a clear error before os.Root enforces the same.
func Clean(p string) (string, error) {
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("path contains a NUL byte: %w", ErrPathEscapes)
	}
	if strings.ContainsRune(p, '\\') {
		return "", fmt.Errorf("path %q contains a backslash: %w", p, ErrPathEscapes)
	}
	if rest, ok := strings.CutPrefix(p, "/workspace/shared"); ok && (rest == "" || rest[0] == '/') {
		p = rest
	}
	p = strings.TrimLeft(p, "/")
	if p == "" {
		return ".", nil
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", fmt.Errorf("path %q contains \"..\": %w", p, ErrPathEscapes)
		}
	}
	c := path.Clean(p)
	if !filepath.IsLocal(c) {
		return "", fmt.Errorf("path %q is not local: %w", p, ErrPathEscapes)
	}
	return c, nil
}

// classify maps errors from os.Root to Corral's classes.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var pe *fs.PathError
	if errors.As(err, &pe) && strings.Contains(pe.Err.Error(), "path escapes") {
		return fmt.Errorf("%s: %w", pe.Path, ErrPathEscapes)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
	}
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%w: %w", err, errdefs.ErrAlreadyExists)
	}
	if errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("%w: %w", err, errdefs.ErrPermissionDenied)
	}
	return err
}

// WriteFileAtomic writes data to name beneath root: a temporary file in the
// same directory, fsync, rename, fsync of the directory. Readers see the old
// content or the new, never a part. Parent directories are created.
func WriteFileAtomic(root *os.Root, name string, data []byte, perm fs.FileMode) error {
	return WriteAtomic(root, name, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// WriteAtomic is WriteFileAtomic with the content written by fill.
func WriteAtomic(root *os.Root, name string, perm fs.FileMode, fill func(io.Writer) error) error {
	dir := path.Dir(name)
	if dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return classify(err)
		}
	}
	// A fixed prefix, not the name: a name near NAME_MAX would push a
	// temporary name built from it past the limit.
	tmp := path.Join(dir, ".corral-tmp-"+randSuffix())
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return classify(err)
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			root.Remove(tmp)
		}
	}()
	if err := fill(f); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := root.Rename(tmp, name); err != nil {
		return classify(err)
	}
	ok = true
	if d, err := root.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
