package workspace

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
)

// Git runs what a repository names: its hooks (.git/hooks, or where
// core.hooksPath says) at commits, checkouts and merges, and the programs
// some keys of .git/config name (core.fsmonitor at every git status, core.sshCommand
// at every fetch, filter drivers at every checkout). A task or session
// writes its workspace's .git like any other directory, and what it
// leaves there runs as the workspace's owner at their next git command,
// outside any sandbox. So the server takes a look before the sandbox
// starts (SnapshotGit) and after it is gone (CheckGit).

// GitSnapshot is what a repository runs, as SnapshotGit found it: each
// regular file of .git/hooks by name, with its content's digest (a link,
// which git runs too, by its target), and the digest of .git/config.
type GitSnapshot struct {
	Hooks  map[string]string `json:"hooks"`
	Config string            `json:"config"`
}

// GitFound is what CheckGit found changed since a snapshot.
type GitFound struct {
	// Hooks are the executable files and the links of .git/hooks
	// created or changed.
	Hooks []string
	// Config are the keys of .git/config that make git run a program,
	// when .git/config changed (all such keys it has then).
	Config []string
}

// maxGitFile bounds what is read of a hook or of .git/config: a larger one
// is known by its size alone (and counts as changed if that changed).
const maxGitFile = 1 << 20

// maxHooks bounds how many entries of .git/hooks are looked at.
const maxHooks = 1000

// maxListed bounds how many hooks a GitFound names (each is disabled
// all the same): the names are a worker's, bound for a result.
const maxListed = 100

// SnapshotGit reads root's .git/hooks and .git/config (nothing of either
// when there is none), following no link.
func SnapshotGit(root *os.Root) (GitSnapshot, error) {
	snap := GitSnapshot{Hooks: map[string]string{}}
	names, err := hookNames(root)
	if err != nil {
		return snap, err
	}
	for _, n := range names {
		if d, ok := hookDigest(root, ".git/hooks/"+n); ok {
			snap.Hooks[n] = d
		}
	}
	snap.Config, _ = digest(root, ".git/config")
	return snap, nil
}

// CheckGit compares root's .git with before, the snapshot of before its
// sandbox started: every executable regular file of .git/hooks that is new
// or changed is listed and, unless allow, loses its execute bits; so is
// every link there that is new or changed, removed unless allow (git runs
// what a hook links to); when .git/config changed, the keys it has that
// run a program are listed. It works in root (an os.Root, which follows
// no link out of it) and changes nothing else.
func CheckGit(root *os.Root, before GitSnapshot, allow bool) (GitFound, error) {
	var found GitFound
	names, err := hookNames(root)
	if err != nil {
		return found, err
	}
	var errs []error
	for _, n := range names {
		p := ".git/hooks/" + n
		fi, err := root.Lstat(p)
		link := err == nil && fi.Mode()&os.ModeSymlink != 0
		if err != nil || (!link && (!fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0)) {
			continue
		}
		if d, ok := hookDigest(root, p); ok && before.Hooks[n] == d {
			continue
		}
		if len(found.Hooks) < maxListed {
			found.Hooks = append(found.Hooks, n)
		}
		switch {
		case allow:
		case link:
			err = root.Remove(p)
		default:
			err = root.Chmod(p, fi.Mode().Perm()&^0o111)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("disable hook %s: %w", n, err))
		}
	}
	if d, _ := digest(root, ".git/config"); d != before.Config && d != "" {
		found.Config = runningKeys(root)
	}
	return found, errors.Join(errs...)
}

// hookNames lists .git/hooks, sorted, at most maxHooks; none if there is
// no such directory (or .git or hooks is not one).
func hookNames(root *os.Root) ([]string, error) {
	for _, d := range []string{".git", ".git/hooks"} {
		if fi, err := root.Lstat(d); err != nil || !fi.IsDir() {
			return nil, nil
		}
	}
	f, err := root.Open(".git/hooks")
	if err != nil {
		return nil, fmt.Errorf("read .git/hooks: %w", err)
	}
	defer f.Close()
	names, err := f.Readdirnames(maxHooks)
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("read .git/hooks: %w", err)
	}
	slices.Sort(names)
	return names, nil
}

// hookDigest is digest, or "link:" and the target of a link.
func hookDigest(root *os.Root, p string) (string, bool) {
	if fi, err := root.Lstat(p); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		target, err := root.Readlink(p)
		return "link:" + target, err == nil
	}
	return digest(root, p)
}

// digest is the SHA-256 of the regular file p of root, or "size:N" for
// one past maxGitFile; false when p is not a regular file.
func digest(root *os.Root, p string) (string, bool) {
	f, fi, err := OpenFile(root, p)
	if err != nil {
		return "", false
	}
	defer f.Close()
	if fi.Size() > maxGitFile {
		return fmt.Sprintf("size:%d", fi.Size()), true
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.LimitReader(f, maxGitFile)); err != nil {
		return "", false
	}
	return hex.EncodeToString(h.Sum(nil)), true
}

// runningKeys are the keys of root's .git/config that make git run a
// program, as "section.key" or "section.subsection.key" (include.path
// too: it brings in more configuration).
func runningKeys(root *os.Root) []string {
	f, _, err := OpenFile(root, ".git/config")
	if err != nil {
		return nil
	}
	defer f.Close()
	var keys []string
	section := ""
	sc := bufio.NewScanner(io.LimitReader(f, maxGitFile))
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if rest, ok := strings.CutPrefix(line, "["); ok {
			head, _, _ := strings.Cut(rest, "]")
			name, sub, quoted := strings.Cut(head, " ")
			section = strings.ToLower(strings.TrimSpace(name))
			if quoted {
				section += "." + strings.Trim(strings.TrimSpace(sub), `"`)
			}
			continue
		}
		key, value, _ := strings.Cut(line, "=")
		full := section + "." + strings.ToLower(strings.TrimSpace(key))
		if runsProgram(full, strings.TrimSpace(value)) && !slices.Contains(keys, full) {
			keys = append(keys, full)
		}
		if len(keys) >= maxListed {
			break
		}
	}
	return keys
}

// runsProgram reports whether git configuration key (lower-cased section
// and name, subsection as written) with value makes git run a program.
func runsProgram(key, value string) bool {
	switch key {
	case "core.hookspath", "core.fsmonitor", "core.sshcommand", "core.pager", "core.editor", "core.askpass",
		"core.gitproxy", "credential.helper", "sequence.editor", "gpg.program", "diff.external",
		"include.path", "uploadpack.packobjectshook":
		return true
	}
	section, rest, _ := strings.Cut(key, ".")
	name := path.Ext(rest) // the last part, after the subsection
	switch {
	case section == "alias":
		return strings.HasPrefix(value, "!")
	case section == "includeif" && name == ".path",
		section == "filter" && (name == ".clean" || name == ".smudge" || name == ".process"),
		section == "diff" && (name == ".command" || name == ".textconv"),
		section == "merge" && name == ".driver",
		section == "credential" && name == ".helper",
		section == "gpg" && name == ".program",
		section == "core" && name == ".sshcommand":
		return true
	}
	return false
}

// gitSnapshotDir holds the snapshots SaveGitSnapshot keeps, one per task
// or session: in run/, the server's alone, so no sandbox changes them and
// they outlive a restart between the start and the check.
const gitSnapshotDir = DirRun + "/git"

// SaveGitSnapshot takes project's snapshot (SnapshotGit) before the
// sandbox of key (a task's or session's id) starts, and keeps it in the
// data root for CheckSavedGit.
func (d *DataRoot) SaveGitSnapshot(key string, project *os.Root) error {
	snap, err := SnapshotGit(project)
	if err != nil {
		return err
	}
	b, err := json.Marshal(snap)
	if err != nil {
		return err
	}
	if err := d.root.MkdirAll(gitSnapshotDir, 0o700); err != nil {
		return fmt.Errorf("keep the workspace's git snapshot: %w", err)
	}
	if err := WriteFileAtomic(d.root, gitSnapshotDir+"/"+key+".json", b, 0o600); err != nil {
		return fmt.Errorf("keep the workspace's git snapshot: %w", err)
	}
	return nil
}

// CheckSavedGit is CheckGit against the snapshot SaveGitSnapshot kept for
// key, once key's sandbox is gone; it removes the snapshot. ok is false
// when there is none (taken by a server of before, or checked already).
func (d *DataRoot) CheckSavedGit(key string, project *os.Root, allow bool) (found GitFound, ok bool, err error) {
	name := gitSnapshotDir + "/" + key + ".json"
	b, err := d.root.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		return found, false, nil
	}
	if err != nil {
		return found, false, err
	}
	var before GitSnapshot
	if err := json.Unmarshal(b, &before); err != nil {
		return found, false, fmt.Errorf("the workspace's git snapshot: %w", err)
	}
	found, err = CheckGit(project, before, allow)
	if err == nil {
		d.root.Remove(name)
	}
	return found, true, err
}
