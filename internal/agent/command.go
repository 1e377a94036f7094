package agent

import (
	"fmt"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
)

// commandAdapter runs any program: Invocation.Command, in the task
// directory, with the prompt on stdin. Its stdout is plain text.
type commandAdapter struct{}

// commandSummaryBytes bounds the summary taken from the end of stdout.
const commandSummaryBytes = 2 << 10

func (commandAdapter) Prepare(inv Invocation) (Process, error) {
	if err := noSession("command", inv); err != nil {
		return Process{}, err
	}
	if len(inv.Command) == 0 || inv.Command[0] == "" {
		return Process{}, fmt.Errorf("prepare command agent: command: empty argv: %w", errdefs.ErrInvalidArgument)
	}
	args := append([]string(nil), inv.Command...)
	if inv.Binary != "" {
		args[0] = inv.Binary
	}
	p := Process{
		Args:        append(args, inv.ExtraArgs...),
		Env:         append([]string(nil), inv.Env...),
		Transcript:  "stdout.log",
		SummaryFile: "output/summary.md",
	}
	stdin(&p, inv)
	return p, nil
}

// Credentials: a command needs none of Corral's choosing.
func (commandAdapter) Credentials() Credentials { return Credentials{} }

func (commandAdapter) NewParser(onProgress func(Progress)) Parser {
	c := &commandParser{tail: tailBuffer{max: 2 * commandSummaryBytes}}
	c.lines = lineSplitter{max: MaxProgressBytes, fn: func(line []byte, long bool) {
		if onProgress == nil {
			return
		}
		s := string(line)
		if long {
			s += "…"
		}
		onProgress(Progress{Kind: ProgressText, Text: s})
	}}
	return c
}

type commandParser struct {
	tail  tailBuffer
	lines lineSplitter
}

func (c *commandParser) Write(p []byte) (int, error) {
	c.tail.Write(p)
	c.lines.Write(p)
	return len(p), nil
}

// Result's summary is the last non-empty lines of stdout, at most
// commandSummaryBytes of them.
func (c *commandParser) Result() Result {
	c.lines.flush()
	return Result{Summary: lastLines(c.tail.String(), commandSummaryBytes), Done: true}
}

// lastLines returns the last non-empty lines of s that fit in n bytes; if
// the last line alone is longer, its end.
func lastLines(s string, n int) string {
	var keep []string
	size := 0
	lines := strings.Split(s, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		line := strings.TrimRight(lines[i], " \t\r")
		if strings.TrimSpace(line) == "" {
			continue
		}
		if size+len(line)+1 > n {
			if len(keep) == 0 {
				keep = append(keep, truncateStart(line, n))
			}
			break
		}
		keep = append(keep, line)
		size += len(line) + 1
	}
	for i, j := 0, len(keep)-1; i < j; i, j = i+1, j-1 {
		keep[i], keep[j] = keep[j], keep[i]
	}
	return strings.Join(keep, "\n")
}
