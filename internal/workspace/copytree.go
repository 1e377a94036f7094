package workspace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// copyChunk is how much CopyFileContext copies between two looks at its
// context: at disk speed, some milliseconds.
const copyChunk = 4 << 20

// CopyFileContext is CopyFileNoSync that stops with ctx's error when ctx
// is done, between two chunks of copyChunk bytes, so that one large file
// cannot hold a bounded copy past its deadline. The file is made durable
// later with the rest of what was copied (SyncFS).
func CopyFileContext(ctx context.Context, src *os.Root, srcName string, dst *os.Root, dstName string, max int64) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	f, info, err := OpenFile(src, srcName)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if info.Size() > max {
		return 0, fmt.Errorf("%s is %d bytes, over the limit of %d: %w", srcName, info.Size(), max, ErrTooLarge)
	}
	var n int64
	err = writeAtomic(dst, dstName, 0o644, false, func(w io.Writer) error {
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			// io.CopyN to an *os.File copies in the kernel
			// (copy_file_range) where the file system can.
			m, err := io.CopyN(w, f, min(copyChunk, max+1-n))
			n += m
			switch {
			case n > max:
				return fmt.Errorf("%s grew past the limit of %d bytes: %w", srcName, max, ErrTooLarge)
			case err == io.EOF:
				return nil
			case err != nil:
				return err
			}
		}
	})
	return n, err
}

// SyncFS makes durable everything written to the file system that holds
// root (syncfs(2)): one flush for a tree written without fsyncs
// (CopyFileContext), where an fsync of each file and of its directory
// costs a journal commit each — 40,000 of them for 20,000 files.
func SyncFS(root *os.Root) error {
	d, err := root.Open(".")
	if err != nil {
		return classify(err)
	}
	defer d.Close()
	if err := unix.Syncfs(int(d.Fd())); err != nil {
		return fmt.Errorf("syncfs: %w", classify(err))
	}
	return nil
}

// TreeCopy is what CopyTree copied, and what it left.
type TreeCopy struct {
	Files, Dirs, Links int
	Bytes              int64
	// Skipped are the entries it did not copy (FIFOs, sockets, devices,
	// names it cannot take, files that vanished meanwhile), at most
	// maxSkipped of them named; SkippedTotal counts them all.
	Skipped      []string `json:",omitempty"`
	SkippedTotal int
}

const maxSkipped = 20

// CopyTree copies the tree beneath src into dst, a worker's tree into a
// directory of the server's: directories, regular files (their executable
// bits kept, nothing else of their modes; in the kernel, reflinked where
// the file system can) and symbolic links as links, never followed; what
// else it holds is skipped and counted. Every name goes through the roots,
// so nothing a worker swaps in meanwhile leads out of either. It stops
// with ctx's error when ctx is done. What it copied is not made durable:
// SyncFS does that, once, for a copy that must outlive a crash.
func CopyTree(ctx context.Context, src, dst *os.Root) (TreeCopy, error) {
	var c TreeCopy
	skip := func(name string) {
		if c.SkippedTotal++; len(c.Skipped) < maxSkipped {
			c.Skipped = append(c.Skipped, name)
		}
	}
	err := walk(src, "", func(rel string, d fs.DirEntry) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		switch t := d.Type(); {
		case t.IsDir():
			if err := dst.Mkdir(rel, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return classify(err)
			}
			c.Dirs++
		case t&fs.ModeSymlink != 0:
			target, err := src.Readlink(rel)
			if err != nil {
				skip(rel)
				return nil
			}
			if err := dst.Symlink(target, rel); err != nil {
				return classify(err)
			}
			c.Links++
		case t.IsRegular():
			n, err := CopyFileContext(ctx, src, rel, dst, rel, 1<<50)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				skip(rel)
				return nil
			}
			if info, err := src.Lstat(rel); err == nil && info.Mode()&0o111 != 0 {
				if err := dst.Chmod(rel, 0o755); err != nil {
					return classify(err)
				}
			}
			c.Files++
			c.Bytes += n
		default:
			skip(rel)
		}
		return nil
	})
	if err != nil {
		return c, err
	}
	return c, nil
}
