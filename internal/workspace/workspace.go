// Package workspace owns Corral's data root on disk (SPEC §1) and every file
// operation on it. Each operation that takes a path from a caller or a worker
// goes through an *os.Root, which refuses "..", absolute paths and symlinks
// that leave the root when the file is opened — no check-then-open race.
package workspace

import (
	"errors"
	"fmt"
	"github.com/corral-dev/corral/internal/clip"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"unicode"
	"unicode/utf8"

	"github.com/corral-dev/corral/internal/errdefs"
)

// ErrPathEscapes is returned for a path that would leave its root.
var ErrPathEscapes = fmt.Errorf("path escapes workspace: %w", errdefs.ErrPermissionDenied)

// ErrTooLarge is returned when a write or copy would pass a size limit.
var ErrTooLarge = errdefs.ErrTooLarge

// Limits on a path a caller gives (seed 001 §2.4.1), in bytes: Linux's
// PATH_MAX for the whole path and NAME_MAX for each name in it. A path
// over them could never name a file; refused here, it says so instead of
// ending as "no such file" or a system call's ENAMETOOLONG.
const (
	MaxPath = 4096
	MaxName = 255
)

// Clean checks a caller's path and returns it as a local, slash-separated
// path relative to its root ("." for the root itself). "/workspace/shared/"
// at its start is taken as relative to the root, since that is how a
// worker and the seed's tools name shared files, and "/" alone names the
// root (a listing of "/"); any other absolute path is refused with
// errdefs.ErrInvalidArgument, as is a path over MaxPath or with a name
// over MaxName. NUL bytes, backslashes, ".." and anything else that is not
// local are refused with ErrPathEscapes, for a clear error before os.Root
// enforces the same.
//
// Clean does not judge the characters of names (see CheckName): it also
// serves reads, and a worker may have created any name in its own
// directory.
func Clean(p string) (string, error) {
	if len(p) > MaxPath {
		return "", fmt.Errorf("path too long: %d bytes, over the limit of %d: %w", len(p), MaxPath, errdefs.ErrInvalidArgument)
	}
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("path contains a NUL byte: %w", ErrPathEscapes)
	}
	if strings.ContainsRune(p, '\\') {
		return "", fmt.Errorf("path %q contains a backslash: %w", short(p), ErrPathEscapes)
	}
	if rest, ok := strings.CutPrefix(p, "/workspace/shared"); ok && (rest == "" || rest[0] == '/') {
		p = strings.TrimLeft(rest, "/")
	}
	if strings.Trim(p, "/") == "" {
		return ".", nil
	}
	for _, part := range strings.Split(p, "/") {
		if part == ".." {
			return "", fmt.Errorf("path %q contains \"..\": %w", short(p), ErrPathEscapes)
		}
		if len(part) > MaxName {
			return "", fmt.Errorf("name too long: %q is %d bytes, over the limit of %d: %w", short(part), len(part), MaxName, errdefs.ErrInvalidArgument)
		}
	}
	if p[0] == '/' {
		return "", fmt.Errorf("path %q is absolute: absolute paths are not allowed; give a path relative to shared/ (or one under /workspace/shared/): %w", short(p), errdefs.ErrInvalidArgument)
	}
	c := path.Clean(p)
	if !filepath.IsLocal(c) {
		return "", fmt.Errorf("path %q is not local: %w", short(p), ErrPathEscapes)
	}
	return c, nil
}

// CheckName refuses a name (a slash-separated path) that must not be
// created: one that is not UTF-8, or that has a control character in it
// (C0, DEL or C1: a newline, a tab, an escape sequence). Such names break
// every listing that shows one name a line, and one that is not UTF-8
// cannot survive a JSON answer to be named again. Every write of this
// package checks its name; a copy does not (CopyFile), since it may carry
// a name a worker gave a file in its own directory, and a caller copying
// such names to where callers list them checks them itself.
func CheckName(name string) error {
	if !utf8.ValidString(name) {
		return fmt.Errorf("name %q is not valid UTF-8: %w", short(name), errdefs.ErrInvalidArgument)
	}
	if i := strings.IndexFunc(name, unicode.IsControl); i >= 0 {
		r, _ := utf8.DecodeRuneInString(name[i:])
		return fmt.Errorf("name %q contains the control character U+%04X; names may not contain newlines, tabs or other control characters: %w", short(name), r, errdefs.ErrInvalidArgument)
	}
	for _, part := range strings.Split(name, "/") {
		if Reserved(part) {
			return fmt.Errorf("name %q is reserved on Windows (CON, PRN, AUX, NUL, COM1-9, LPT1-9, with any extension), where a workspace may be copied: %w", short(part), errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// Reserved reports whether name (one path element) is one of the device
// names Windows reserves, in any case and with any extension: CON, PRN,
// AUX, NUL, COM1 to COM9, LPT1 to LPT9 ("nul.txt", "Com1.log").
func Reserved(name string) bool {
	stem, _, _ := strings.Cut(name, ".")
	stem = strings.ToUpper(strings.TrimRight(stem, " "))
	switch stem {
	case "CON", "PRN", "AUX", "NUL":
		return true
	}
	if len(stem) == 4 && (strings.HasPrefix(stem, "COM") || strings.HasPrefix(stem, "LPT")) {
		return stem[3] >= '1' && stem[3] <= '9'
	}
	return false
}

// short cuts a caller's path for an error message: a message need not
// repeat 4 KiB of it.
func short(s string) string { return clip.String(s, 80) }

// classify maps errors from os.Root to Corral's classes.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var pe *fs.PathError
	if errors.As(err, &pe) && strings.Contains(pe.Err.Error(), "path escapes") {
		return fmt.Errorf("%s: %w", pe.Path, ErrPathEscapes)
	}
	if errors.Is(err, syscall.ENAMETOOLONG) {
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
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
// content or the new, never a part. Parent directories are created. A name
// CheckName refuses is refused.
func WriteFileAtomic(root *os.Root, name string, data []byte, perm fs.FileMode) error {
	return WriteAtomic(root, name, perm, fillWith(data))
}

// WriteFileAtomicNoSync is WriteFileAtomic without the two fsyncs: readers
// still see the old content or the new, but a power loss may leave
// neither. For a file whose durability buys nothing (the worker's
// status.json, which the server reads at once, before it commits the
// task's end, and which a power loss would leave beside output files
// nothing made durable either), or that is made durable later with the
// rest of its tree (SyncTreeLater).
func WriteFileAtomicNoSync(root *os.Root, name string, data []byte, perm fs.FileMode) error {
	if err := CheckName(name); err != nil {
		return err
	}
	return writeAtomic(root, name, perm, false, fillWith(data))
}

// fillWith is the fill of a write whose content is data.
func fillWith(data []byte) func(io.Writer) error {
	return func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	}
}

// WriteAtomic is WriteFileAtomic with the content written by fill.
func WriteAtomic(root *os.Root, name string, perm fs.FileMode, fill func(io.Writer) error) error {
	if err := CheckName(name); err != nil {
		return err
	}
	return writeAtomic(root, name, perm, true, fill)
}

// writeAtomic is WriteAtomic whatever the name's characters; durable
// fsyncs the file before the rename and the directory after it.
func writeAtomic(root *os.Root, name string, perm fs.FileMode, durable bool, fill func(io.Writer) error) error {
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
	if durable {
		if err := f.Sync(); err != nil {
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := root.Rename(tmp, name); err != nil {
		return classify(err)
	}
	ok = true
	if !durable {
		return nil
	}
	// As far as the file system allows: some refuse an fsync of a
	// directory, and nothing better is possible there.
	if d, err := root.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// maxSyncLater bounds the files SyncTreeLater holds open; it syncs those
// past it at once.
const maxSyncLater = 256

// SyncTreeLater opens every regular file beneath root, and every directory
// that has entries, and returns what makes them all durable (an fsync of
// each, files first, then directories deepest first): for a tree written
// without fsyncs (WriteFileAtomicNoSync, CopyFileNoSync) whose durability
// is waited for later, beside other work. Opened first, they are the files
// and directories written even if they have been moved or renamed over
// since: a warm sandbox's claim moves a task's entries out of its directory
// as soon as the task is recorded, which can be before the fsyncs run.
// Symbolic links are not followed. Past maxSyncLater files, the rest are
// synced at once, before it returns.
func SyncTreeLater(root *os.Root) (sync func() error, err error) {
	var files, dirs []*os.File
	closeAll := func() {
		for _, f := range append(files, dirs...) {
			f.Close()
		}
	}
	err = fs.WalkDir(root.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() && !d.IsDir() {
			return nil
		}
		f, err := root.Open(name)
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if ents, _ := f.ReadDir(1); len(ents) == 0 {
				f.Close() // nothing in it to make durable
				return nil
			}
			dirs = append(dirs, f)
		case len(files) < maxSyncLater:
			files = append(files, f)
		default:
			err = f.Sync()
			f.Close()
		}
		return err
	})
	if err != nil {
		closeAll()
		return nil, classify(err)
	}
	return func() error {
		defer closeAll()
		for _, f := range files {
			if err := f.Sync(); err != nil {
				return err
			}
		}
		for i := len(dirs) - 1; i >= 0; i-- {
			dirs[i].Sync() // some file systems refuse it; nothing better is possible there
		}
		return nil
	}, nil
}
