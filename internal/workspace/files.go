package workspace

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/filetype"
)

// File describes a regular file beneath a root.
type File struct {
	Name string `json:"name"` // slash-separated, relative to the listed directory
	Size int64  `json:"size"`
	Type string `json:"type"` // MIME type
}

// Entry is one item of a directory listing.
type Entry struct {
	Path     string    `json:"path"` // slash-separated, relative to the root
	IsDir    bool      `json:"is_dir"`
	Size     int64     `json:"size"`
	Modified time.Time `json:"modified"`
}

// ListFiles returns every regular file beneath dir, recursively, sorted by
// name. Symbolic links and other non-regular files are skipped, never
// followed; their names are returned in skipped.
func ListFiles(root *os.Root, dir string) (files []File, skipped []string, err error) {
	err = walk(root, dir, func(rel string, d fs.DirEntry) error {
		if !d.Type().IsRegular() {
			if !d.IsDir() {
				skipped = append(skipped, rel)
			}
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		files = append(files, File{Name: rel, Size: info.Size(), Type: DetectType(root, path.Join(dir, rel))})
		return nil
	})
	return files, skipped, err
}

// Size returns the total size of the regular files beneath dir.
func Size(root *os.Root, dir string) (int64, error) {
	var total int64
	err := walk(root, dir, func(_ string, d fs.DirEntry) error {
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			total += info.Size()
		}
		return nil
	})
	return total, err
}

// List lists dir beneath root: its entries, or with recursive every entry
// beneath it. Symbolic links are listed as files and never followed.
func List(root *os.Root, dir string, recursive bool) ([]Entry, error) {
	dir, err := Clean(dir)
	if err != nil {
		return nil, err
	}
	info, err := root.Stat(dir)
	if err != nil {
		return nil, classify(err)
	}
	if !info.IsDir() {
		return nil, fmt.Errorf("%s is a file, not a directory: %w", dir, ErrNotDir)
	}
	var out []Entry
	err = walk(root, dir, func(rel string, d fs.DirEntry) error {
		info, err := d.Info()
		if err != nil {
			return nil // vanished while listing
		}
		e := Entry{Path: path.Join(dir, rel), IsDir: d.IsDir(), Modified: info.ModTime().UTC()}
		if !d.IsDir() {
			e.Size = info.Size()
		}
		out = append(out, e)
		if d.IsDir() && !recursive {
			return fs.SkipDir
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, err
}

// walk calls fn for everything beneath dir (not dir itself), with a path
// relative to dir. It does not follow symbolic links.
func walk(root *os.Root, dir string, fn func(rel string, d fs.DirEntry) error) error {
	fsys := root.FS()
	if dir == "" {
		dir = "."
	}
	err := fs.WalkDir(fsys, dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil // unreadable or vanished entry: skip it
		}
		if p == dir {
			return nil
		}
		rel := strings.TrimPrefix(p, dir+"/")
		if dir == "." {
			rel = p
		}
		return fn(rel, d)
	})
	return classify(err)
}

// ErrNotDir is returned when a directory was expected.
var ErrNotDir = fmt.Errorf("not a directory: %w", errdefs.ErrFailedPrecondition)

// DetectType returns a file's MIME type (package filetype): from its
// first bytes, with its extension among text types. A file that cannot be
// opened as a regular file is application/octet-stream.
func DetectType(root *os.Root, name string) string {
	f, _, err := OpenFile(root, name)
	if err != nil {
		return "application/octet-stream"
	}
	defer f.Close()
	buf := make([]byte, filetype.HeadBytes)
	n, _ := io.ReadFull(f, buf)
	return filetype.Detect(name, buf[:n])
}

// ReadFile reads name beneath root, up to max bytes; truncated says whether
// there was more. It refuses directories and non-regular files.
func ReadFile(root *os.Root, name string, max int64) (data []byte, truncated bool, err error) {
	name, err = Clean(name)
	if err != nil {
		return nil, false, err
	}
	f, info, err := OpenFile(root, name)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	_ = info
	data, err = io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, false, err
	}
	if int64(len(data)) > max {
		return data[:max], true, nil
	}
	return data, false, nil
}

// OpenFile opens a regular file beneath root for reading. A symbolic link
// is refused even if it stays inside the root, so a worker cannot make the
// server read something else in its place; so is anything but a regular
// file, judged on what was opened (a worker may swap a file for a FIFO
// between a look and the open), and the open never waits (O_NONBLOCK: a
// FIFO without a writer would otherwise block it for ever).
func OpenFile(root *os.Root, name string) (*os.File, fs.FileInfo, error) {
	name, err := Clean(name)
	if err != nil {
		return nil, nil, err
	}
	li, err := root.Lstat(name)
	if err != nil {
		return nil, nil, classify(err)
	}
	if li.Mode()&fs.ModeSymlink != 0 {
		return nil, nil, fmt.Errorf("%s is a symbolic link: %w", name, ErrPathEscapes)
	}
	if li.IsDir() {
		return nil, nil, fmt.Errorf("%s is a directory: %w", name, ErrIsDir)
	}
	if !li.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%s is not a regular file: %w", name, ErrPathEscapes)
	}
	f, err := root.OpenFile(name, os.O_RDONLY|openFlags, 0)
	if err != nil {
		return nil, nil, classify(err)
	}
	info, err := f.Stat()
	if err != nil || !info.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("%s is not a regular file: %w", name, ErrPathEscapes)
	}
	return f, info, nil
}

// ErrIsDir is returned when a file was expected and a directory found.
var ErrIsDir = fmt.Errorf("is a directory: %w", errdefs.ErrFailedPrecondition)

// CopyFile copies srcName beneath src to dstName beneath dst, atomically,
// refusing symbolic links and anything over max bytes (ErrTooLarge). It
// returns the number of bytes copied. dstName's characters are not checked
// (CheckName): a copy may keep the name a worker gave its file.
func CopyFile(src *os.Root, srcName string, dst *os.Root, dstName string, max int64) (int64, error) {
	return copyFile(src, srcName, dst, dstName, max, true)
}

// CopyFileNoSync is CopyFile without the two fsyncs, for a file made
// durable later with the rest of its tree (SyncTreeLater).
func CopyFileNoSync(src *os.Root, srcName string, dst *os.Root, dstName string, max int64) (int64, error) {
	return copyFile(src, srcName, dst, dstName, max, false)
}

func copyFile(src *os.Root, srcName string, dst *os.Root, dstName string, max int64, durable bool) (int64, error) {
	f, info, err := OpenFile(src, srcName)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if info.Size() > max {
		return 0, fmt.Errorf("%s is %d bytes, over the limit of %d: %w", srcName, info.Size(), max, ErrTooLarge)
	}
	var n int64
	err = writeAtomic(dst, dstName, 0o644, durable, func(w io.Writer) error {
		n, err = io.Copy(w, io.LimitReader(f, max+1))
		if err == nil && n > max {
			return fmt.Errorf("%s grew past the limit of %d bytes: %w", srcName, max, ErrTooLarge)
		}
		return err
	})
	return n, err
}
