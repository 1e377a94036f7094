package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/rtkind"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// The prefixes of the ids the server makes, which a person may leave out
// of a prefix they type (corral result 3fk for task-3fk…).
const (
	taskIDPrefix    = "task-"
	sessionIDPrefix = "sess-"
)

// maxListPage is the largest page of tasks the server gives.
const maxListPage = 500

// resolveTask returns the id of the one task whose id starts with arg (with
// or without its task- prefix), read through the list API. A whole id is
// taken as it is, without a list.
func resolveTask(ctx context.Context, c *httpapi.Client, arg string) (string, error) {
	if task.ValidID(arg) {
		return arg, nil
	}
	var ids []string
	req := service.ListRequest{Limit: maxListPage}
	for {
		page, err := c.List(ctx, req)
		if err != nil {
			return "", err
		}
		for _, t := range page.Tasks {
			ids = append(ids, t.ID)
		}
		if page.NextCursor == "" {
			break
		}
		req.Cursor = page.NextCursor
	}
	return matchID("task", taskIDPrefix, arg, ids)
}

// resolveSession is resolveTask for a session.
func resolveSession(ctx context.Context, c *httpapi.Client, arg string) (string, error) {
	list, err := c.ListSessions(ctx)
	if err != nil {
		return "", err
	}
	ids := make([]string, len(list))
	for i, s := range list {
		ids[i] = s.ID
	}
	return matchID("session", sessionIDPrefix, arg, ids)
}

// matchID returns the one id of ids that arg is a prefix of, with or
// without kindPrefix: an id equal to arg wins; none is ErrNotFound; more
// than one is an error that lists them.
func matchID(kind, kindPrefix, arg string, ids []string) (string, error) {
	if arg == "" {
		return "", usagef("give a %s id", kind)
	}
	var found []string
	for _, id := range ids {
		if id == arg {
			return id, nil
		}
		if strings.HasPrefix(id, arg) || strings.HasPrefix(id, kindPrefix+arg) {
			found = append(found, id)
		}
	}
	switch len(found) {
	case 0:
		return "", fmt.Errorf("no %s id starts with %q: %w", kind, arg, errdefs.ErrNotFound)
	case 1:
		return found[0], nil
	}
	const most = 10
	list := found
	if len(list) > most {
		list = list[:most]
	}
	more := ""
	if len(found) > most {
		more = fmt.Sprintf(" and %d more", len(found)-most)
	}
	return "", fmt.Errorf("%s id prefix %q is ambiguous: it starts %d ids: %s%s: %w", kind, arg, len(found), strings.Join(list, ", "), more, errdefs.ErrInvalidArgument)
}

// completeTasks completes a task id from the server's newest tasks, each
// with its status and description; completeSessions a session id. They
// reach the server with the command's own flags, and offer nothing when
// it does not answer.
func completeTasks(cf *clientFlags) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		c, err := cf.client()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		page, err := c.List(cmd.Context(), service.ListRequest{Limit: maxListPage})
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []cobra.Completion
		for _, t := range page.Tasks {
			if strings.HasPrefix(t.ID, toComplete) {
				out = append(out, cobra.CompletionWithDesc(t.ID, string(t.Status)+" "+oneLine(t.Description, 50)))
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

func completeSessions(cf *clientFlags) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		c, err := cf.client()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		list, err := c.ListSessions(cmd.Context())
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []cobra.Completion
		for _, s := range list {
			if strings.HasPrefix(s.ID, toComplete) && s.Status != service.SessionEnded {
				out = append(out, cobra.CompletionWithDesc(s.ID, s.Status+" "+s.Runtime))
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// firstArg completes only the first argument with fn.
func firstArg(fn cobra.CompletionFunc) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return fn(cmd, args, toComplete)
	}
}

// completeRuntimes completes --runtime.
func completeRuntimes(cmd *cobra.Command) {
	cmd.RegisterFlagCompletionFunc("runtime", cobra.FixedCompletions(rtkind.Names(), cobra.ShellCompDirectiveNoFileComp))
}
