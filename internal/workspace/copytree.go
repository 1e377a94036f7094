package workspace

import (
	"context"
	"fmt"
	"io"
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
