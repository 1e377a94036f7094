package library

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/corral-dev/corral/internal/clip"
	"github.com/corral-dev/corral/internal/service"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/skill"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/units"
	"github.com/corral-dev/corral/internal/workspace"
)

// skillsDir is where skills live, relative to shared/.
const skillsDir = "skills"

// Skill limits that are not configurable.
const (
	maxSkillFiles      = 200
	maxSkillBytes      = 32 << 20 // all of a skill's files together
	maxSkillsInPrompt  = 50
	skillSummaryLength = 200
)

// ListSkills lists shared/skills/*/SKILL.md by name.
func (o *Library) ListSkills(ctx context.Context) ([]service.SkillInfo, error) {
	ents, err := workspace.List(o.data.Shared(), skillsDir, false)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return []service.SkillInfo{}, nil
		}
		return nil, fmt.Errorf("list skills: %w", err)
	}
	out := []service.SkillInfo{}
	for _, e := range ents {
		name := path.Base(e.Path)
		if !e.IsDir || strings.HasPrefix(name, ".") {
			continue
		}
		info, _, err := o.readSkill(name)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // a directory without SKILL.md is not a skill
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b service.SkillInfo) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// readSkill reads and parses a skill's SKILL.md. A SKILL.md that does not
// parse is returned with Error set and a nil error; a missing one is
// ErrNotFound.
func (o *Library) readSkill(dirName string) (service.SkillInfo, string, error) {
	p := skillsDir + "/" + dirName + "/" + skill.FileName
	data, truncated, err := workspace.ReadFile(o.data.Shared(), p, skill.MaxFileBytes)
	if err != nil {
		return service.SkillInfo{}, "", err
	}
	info := service.SkillInfo{Path: p}
	info.Name = dirName
	if truncated {
		info.Error = fmt.Sprintf("SKILL.md is over %d bytes", skill.MaxFileBytes)
		return info, string(data), nil
	}
	s, err := skill.Parse(data)
	switch {
	case err != nil:
		info.Error = err.Error()
	case s.Name != dirName:
		info.Error = fmt.Sprintf("name %q in SKILL.md differs from the directory name %q", s.Name, dirName)
	default:
		info.Skill = s
	}
	return info, string(data), nil
}

// GetSkill returns a skill.
func (o *Library) GetSkill(ctx context.Context, name string) (service.SkillDetail, error) {
	if err := skill.CheckName(name); err != nil {
		return service.SkillDetail{}, err
	}
	info, content, err := o.readSkill(name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return service.SkillDetail{}, fmt.Errorf("no skill %q: %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return service.SkillDetail{}, fmt.Errorf("read skill %s: %w", name, err)
	}
	files, err := workspace.List(o.data.Shared(), skillsDir+"/"+name, true)
	if err != nil {
		return service.SkillDetail{}, fmt.Errorf("list skill %s: %w", name, err)
	}
	for i := range files {
		files[i].Path = strings.TrimPrefix(files[i].Path, skillsDir+"/"+name+"/")
	}
	if files == nil {
		files = []workspace.Entry{}
	}
	return service.SkillDetail{SkillInfo: info, Content: content, Files: files}, nil
}

// CreateSkill writes shared/skills/<name>/ atomically: the files go into a
// hidden directory beside it, which is renamed into place once complete, so
// a reader never sees half a skill and a failure leaves nothing.
func (o *Library) CreateSkill(ctx context.Context, req service.CreateSkillRequest) (service.SkillDetail, error) {
	def, files, srcTask, err := o.skillSource(ctx, req)
	if err != nil {
		return service.SkillDetail{}, err
	}
	s, err := skill.Parse(def)
	if err != nil {
		return service.SkillDetail{}, err
	}
	var total int64 = int64(len(def))
	for _, f := range files {
		total += f.Size
	}
	if total > maxSkillBytes {
		return service.SkillDetail{}, &errdefs.FieldError{Field: "files", Err: fmt.Errorf("the skill is %s, over the limit of %s: %w", units.FormatSize(total), units.FormatSize(maxSkillBytes), errdefs.ErrTooLarge)}
	}
	if err := o.checkSharedQuota(total); err != nil {
		return service.SkillDetail{}, err
	}

	o.skillMu.Lock()
	defer o.skillMu.Unlock()
	final := skillsDir + "/" + s.Name
	if _, err := o.data.Shared().Lstat(final); err == nil {
		return service.SkillDetail{}, fmt.Errorf("a skill named %q exists: %w", s.Name, errdefs.ErrAlreadyExists)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return service.SkillDetail{}, fmt.Errorf("create skill %s: %w", s.Name, err)
	}
	var rnd [6]byte
	rand.Read(rnd[:])
	tmp := skillsDir + "/.tmp-" + s.Name + "-" + hex.EncodeToString(rnd[:])
	sh := o.data.Shared()
	ok := false
	defer func() {
		if !ok {
			sh.RemoveAll(tmp)
		}
	}()
	if err := sh.MkdirAll(tmp, 0o755); err != nil {
		return service.SkillDetail{}, fmt.Errorf("create skill %s: %w", s.Name, err)
	}
	if err := workspace.WriteFileAtomic(sh, tmp+"/"+skill.FileName, def, 0o644); err != nil {
		return service.SkillDetail{}, fmt.Errorf("create skill %s: %w", s.Name, err)
	}
	names := []string{skill.FileName}
	if len(files) > 0 {
		dir, err := o.data.OpenTask(srcTask)
		if err != nil {
			return service.SkillDetail{}, &errdefs.FieldError{Field: "task_id", Err: err}
		}
		defer dir.Close()
		out, err := dir.OpenRoot("output")
		if err != nil {
			return service.SkillDetail{}, &errdefs.FieldError{Field: "task_id", Err: fmt.Errorf("task %s has no output directory: %w", srcTask, errdefs.ErrNotFound)}
		}
		defer out.Close()
		for i, f := range files {
			if err := workspace.CheckName(f.Name); err != nil {
				return service.SkillDetail{}, &errdefs.FieldError{Field: fmt.Sprintf("files[%d]", i), Err: err}
			}
			if _, err := workspace.CopyFile(out, f.Name, sh, tmp+"/"+f.Name, maxSkillBytes); err != nil {
				return service.SkillDetail{}, &errdefs.FieldError{Field: fmt.Sprintf("files[%d]", i), Err: err}
			}
			names = append(names, f.Name)
		}
	}
	if err := sh.Rename(tmp, final); err != nil {
		// Another writer (write_workspace) made the directory meanwhile.
		if _, serr := sh.Lstat(final); serr == nil {
			return service.SkillDetail{}, fmt.Errorf("a skill named %q exists: %w", s.Name, errdefs.ErrAlreadyExists)
		}
		return service.SkillDetail{}, fmt.Errorf("create skill %s: %w", s.Name, err)
	}
	ok = true
	sum := sha256.Sum256(def)
	data, _ := json.Marshal(task.SkillCreated{Name: s.Name, Description: s.Description, DockerImage: s.DockerImage,
		Dependencies: s.Dependencies, Files: names, FromTaskID: srcTask, SHA256: hex.EncodeToString(sum[:])})
	if _, err := o.store.Append(ctx, task.SkillStreamID(s.Name), eventstore.AnyVersion, eventstore.Proposed{
		Type: task.EventSkillCreated, SchemaVersion: task.SchemaVersion, Data: data, Actor: service.ActorFrom(ctx),
	}); err != nil {
		sh.RemoveAll(final) // unrecorded: take it back
		return service.SkillDetail{}, fmt.Errorf("record skill %s: %w", s.Name, err)
	}
	o.log.Info("skill created", "skill", s.Name, "files", len(names), "from_task", srcTask, "actor", service.ActorFrom(ctx))
	return o.GetSkill(ctx, s.Name)
}

// skillSource returns the SKILL.md a create request means and the task
// output files to copy beside it, after checking every argument.
func (o *Library) skillSource(ctx context.Context, req service.CreateSkillRequest) ([]byte, []task.OutputFile, string, error) {
	var errs []error
	fields := req.Name != "" || req.Description != "" || req.DockerImage != "" || len(req.Dependencies) > 0 || req.Instructions != ""
	if req.Content != "" && fields {
		errs = append(errs, errdefs.Field("content", "give either content (a whole SKILL.md) or name, description and instructions, not both"))
	}
	var outputs []task.OutputFile
	if req.TaskID != "" {
		t, err := o.task(req.TaskID)
		switch {
		case err != nil:
			errs = append(errs, &errdefs.FieldError{Field: "task_id", Err: err})
		case t.Status != task.Success:
			errs = append(errs, &errdefs.FieldError{Field: "task_id", Err: fmt.Errorf("task %s is %s; a skill is made from a task that succeeded: %w", t.ID, t.Status, errdefs.ErrFailedPrecondition)})
		default:
			outputs = t.OutputFiles
		}
	} else if len(req.Files) > 0 {
		errs = append(errs, errdefs.Field("files", "needs task_id: files are a task's output files"))
	}
	if len(errs) > 0 {
		return nil, nil, "", errors.Join(errs...)
	}

	var def []byte
	switch {
	case req.Content != "":
		def = []byte(req.Content)
	case fields:
		def = skill.Render(skill.Skill{Name: req.Name, Description: req.Description, DockerImage: req.DockerImage, Dependencies: req.Dependencies, Body: req.Instructions})
	case req.TaskID != "":
		if !slices.ContainsFunc(outputs, func(f task.OutputFile) bool { return f.Name == skill.FileName }) {
			return nil, nil, "", errdefs.Field("content", "is required: give content or name and description, or a task whose output has SKILL.md")
		}
		dir, err := o.data.OpenTask(req.TaskID)
		if err != nil {
			return nil, nil, "", &errdefs.FieldError{Field: "task_id", Err: err}
		}
		defer dir.Close()
		b, truncated, err := workspace.ReadFile(dir, "output/"+skill.FileName, skill.MaxFileBytes)
		if err != nil {
			return nil, nil, "", &errdefs.FieldError{Field: "task_id", Err: err}
		}
		if truncated {
			return nil, nil, "", &errdefs.FieldError{Field: "content", Err: fmt.Errorf("the task's SKILL.md is over %d bytes: %w", skill.MaxFileBytes, errdefs.ErrTooLarge)}
		}
		def = b
	default:
		return nil, nil, "", errdefs.Field("content", "is required: give content (a whole SKILL.md), or name and description, or task_id")
	}

	// The output files to copy: those asked for, or all but SKILL.md (the
	// definition is written from def).
	var files []task.OutputFile
	if len(req.Files) > 0 {
		if len(req.Files) > maxSkillFiles {
			return nil, nil, "", errdefs.Field("files", fmt.Sprintf("has %d files, over the limit of %d", len(req.Files), maxSkillFiles))
		}
		seen := map[string]bool{}
		for i, f := range req.Files {
			field := fmt.Sprintf("files[%d]", i)
			c, err := workspace.Clean(f)
			if err != nil {
				errs = append(errs, &errdefs.FieldError{Field: field, Err: err})
				continue
			}
			j := slices.IndexFunc(outputs, func(o task.OutputFile) bool { return o.Name == c })
			switch {
			case j < 0:
				errs = append(errs, &errdefs.FieldError{Field: field, Err: fmt.Errorf("%q is not an output file of task %s: %w", clip.String(c, 64), req.TaskID, errdefs.ErrNotFound)})
			case c == skill.FileName:
				errs = append(errs, errdefs.Field(field, "SKILL.md is the definition, not a file to copy"))
			case seen[c]:
				errs = append(errs, errdefs.Field(field, fmt.Sprintf("%q is listed twice", c)))
			default:
				seen[c] = true
				files = append(files, outputs[j])
			}
		}
	} else {
		for _, f := range outputs {
			if f.Name != skill.FileName {
				files = append(files, f)
			}
		}
		if len(files) > maxSkillFiles {
			errs = append(errs, errdefs.Field("task_id", fmt.Sprintf("the task has %d output files, over the limit of %d; choose some with files", len(files), maxSkillFiles)))
		}
	}
	if len(errs) > 0 {
		return nil, nil, "", errors.Join(errs...)
	}
	return def, files, req.TaskID, nil
}

// PromptSkills lists the valid skills with their one-line descriptions
// for prompt.md (SPEC §5), at most maxSkillsInPrompt; more says there are
// more.
func (o *Library) PromptSkills() (files []ContextFile, more bool) {
	skills, err := o.ListSkills(context.Background())
	if err != nil {
		o.log.Warn("cannot list skills for the prompt", "err", err)
		return nil, false
	}
	for _, s := range skills {
		if s.Error != "" {
			continue
		}
		if len(files) == maxSkillsInPrompt {
			return files, true
		}
		files = append(files, ContextFile{Name: s.Name + "/SKILL.md", About: s.Summary(skillSummaryLength)})
	}
	return files, false
}
