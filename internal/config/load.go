package config

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"reflect"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/corral-dev/corral/internal/errdefs"
)

// DefaultFile is the configuration file Load reads from the working
// directory when no path is given and it exists.
const DefaultFile = "corral.yaml"

// LoadOptions says where Load finds each layer.
type LoadOptions struct {
	// Path is the configuration file. Empty means CORRAL_CONFIG, then
	// ./corral.yaml if it exists, else no file. A file named by Path or
	// CORRAL_CONFIG must exist.
	Path string
	// Environ is the environment as KEY=VALUE strings; nil means
	// os.Environ(). Tests pass their own.
	Environ []string
	// ExpandEnv turns on $VAR and ${VAR} expansion in the file's values,
	// from Environ ($$ is a literal $). It is off by default, so a file
	// means the same thing whatever the environment holds.
	ExpandEnv bool
	// Flags are applied last, over the environment.
	Flags Flags
}

// Flags are values given on the command line. A nil field was not given.
type Flags struct {
	Listen        *string // --listen
	Data          *string // --data
	Runtime       *string // --runtime
	MaxConcurrent *int    // --max-concurrent
}

// RegisterFlags defines Corral's configuration flags on set, storing what
// the user gives into o: --config, --config.expand-env, --listen, --data,
// --runtime and --max-concurrent. Flags that are not given leave o alone,
// so they never override the file or the environment with a default.
func (o *LoadOptions) RegisterFlags(set *flag.FlagSet) {
	o.RegisterClientFlags(set)
	str := func(dst **string) func(string) error {
		return func(s string) error { *dst = &s; return nil }
	}
	set.Func("listen", "HTTP listen address host:port (default 127.0.0.1:7777)", str(&o.Flags.Listen))
	set.Func("data", "data root directory (default ./corral-data)", str(&o.Flags.Data))
	set.Func("runtime", "default runtime: local, gvisor, docker or kubernetes (default local)", str(&o.Flags.Runtime))
	set.Func("max-concurrent", "workers that may run at once (default 3)", func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil {
			return errors.New("must be a whole number")
		}
		o.Flags.MaxConcurrent = &n
		return nil
	})
}

// RegisterClientFlags defines the flags that say where the configuration
// is, for the commands that are clients of a server (they read its listen
// address and token): --config and --config.expand-env. The server's own
// flags are left out, since a client would have to ignore them.
func (o *LoadOptions) RegisterClientFlags(set *flag.FlagSet) {
	set.StringVar(&o.Path, "config", o.Path, "configuration file (default $CORRAL_CONFIG, then ./corral.yaml if it exists)")
	set.BoolVar(&o.ExpandEnv, "config.expand-env", o.ExpandEnv, "expand $VAR and ${VAR} in the configuration file")
}

// Load builds the configuration from Default(), then the file, then the
// environment, then opts.Flags, and validates the result. Errors name the
// key (and the file line, environment variable or flag) and are classified
// errdefs.ErrInvalidArgument, except a missing file named by Path or
// CORRAL_CONFIG, which is errdefs.ErrNotFound.
func Load(opts LoadOptions) (*Config, error) {
	environ := opts.Environ
	if environ == nil {
		environ = os.Environ()
	}
	env := envMap(environ)

	c := Default()
	path := opts.Path
	if path == "" {
		path = env["CORRAL_CONFIG"]
	}
	if path == "" {
		if _, err := os.Stat(DefaultFile); err == nil {
			path = DefaultFile
		}
	}
	if path != "" {
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("read config file %s: %w", path, errdefs.ErrNotFound)
		}
		if err != nil {
			return nil, fmt.Errorf("read config file: %w", err)
		}
		if err := c.decodeFile(data, path, opts.ExpandEnv, env); err != nil {
			return nil, err
		}
		c.file = path
		c.expanded = opts.ExpandEnv
	}
	if err := c.applyEnv(env); err != nil {
		return nil, err
	}
	for i := range c.Egress.Credentials {
		if e := c.Egress.Credentials[i].SecretEnv; e != "" {
			c.Egress.Credentials[i].fromEnv = env[e]
		}
	}
	c.applyFlags(opts.Flags)
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// fileSecrets are keys that would hold a secret in the file. They are
// refused with a hint rather than reported as unknown.
var fileSecrets = map[string]string{
	"api_token":                       "use api_token_file or the CORRAL_API_TOKEN environment variable",
	"ai_worker_config.webhook_secret": "use ai_worker_config.webhook_secret_file or the AI_WORKER_WEBHOOK_SECRET environment variable",
	"notify.secret":                   "use notify.secret_file",
	"api_tokens.token":                "use token_file",
}

// listIndex matches the [N] of a key inside a list, to look up fileSecrets.
var listIndex = lazyRegexp(`\[[0-9]+\]`)

// decodeFile decodes a YAML document over c. It walks the node tree itself
// rather than using yaml.Decoder.KnownFields so that every error names the
// dotted key and line, and so that secrets and expansion are handled per
// value.
func (c *Config) decodeFile(data []byte, name string, expand bool, env map[string]string) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty file is all defaults
		}
		return fmt.Errorf("parse config file %s: %v%s: %w", name, strings.TrimPrefix(err.Error(), "yaml: "), syntaxContext(data, err), errdefs.ErrInvalidArgument)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return fmt.Errorf("parse config file %s: holds more than one YAML document: %w", name, errdefs.ErrInvalidArgument)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if isNull(root) {
		return nil
	}
	if root.Kind != yaml.MappingNode {
		return fmt.Errorf("parse config file %s: line %d: the top level must be a mapping of keys: %w", name, root.Line, errdefs.ErrInvalidArgument)
	}
	d := &fileDecoder{file: name, expand: expand, env: env, expanded: map[*yaml.Node]bool{}}

	// Check the version first: a file in another format would otherwise
	// drown the one useful error in unknown keys.
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value != "version" {
			continue
		}
		var v int
		d.decode(root.Content[i+1], reflect.ValueOf(&v).Elem(), "version")
		if len(d.errs) == 0 && v != 0 && v != Version {
			d.fail("version", root.Content[i+1].Line, "unsupported config version %d (this corral reads version %d)", v, Version)
		}
		if len(d.errs) > 0 {
			return errors.Join(d.errs...)
		}
	}

	d.decode(root, reflect.ValueOf(c).Elem(), "")
	if c.Version == 0 {
		c.Version = Version
	}
	return errors.Join(d.errs...)
}

type fileDecoder struct {
	file     string
	expand   bool
	env      map[string]string
	expanded map[*yaml.Node]bool // aliased nodes are expanded once
	errs     []error
}

func (d *fileDecoder) fail(key string, line int, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	d.errs = append(d.errs, &errdefs.FieldError{Field: key, Err: fmt.Errorf("%s (%s line %d)", msg, d.file, line)})
}

var unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()

// decode decodes n into v, which is at dotted key path. Structs are walked
// key by key; everything else is decoded by the YAML library.
func (d *fileDecoder) decode(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if isNull(n) {
		return // a key with no value keeps its default
	}
	if v.Kind() == reflect.Struct && !reflect.PointerTo(v.Type()).Implements(unmarshalerType) {
		d.decodeStruct(n, v, path)
		return
	}
	if v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Struct && !reflect.PointerTo(v.Type().Elem()).Implements(unmarshalerType) {
		// A list of structs (api_tokens): each element key by key, so
		// unknown keys and secrets are caught there too.
		if n.Kind != yaml.SequenceNode {
			d.fail(path, n.Line, "must be a list")
			return
		}
		out := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, e := range n.Content {
			d.decode(e, out.Index(i), fmt.Sprintf("%s[%d]", path, i))
		}
		v.Set(out)
		return
	}
	if d.expand && !d.expandValues(n, path) {
		return
	}
	if err := n.Decode(v.Addr().Interface()); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) {
			d.fail(path, n.Line, "must be %s", describe(v.Type()))
			return
		}
		d.fail(path, n.Line, "%v", err)
	}
}

func (d *fileDecoder) decodeStruct(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.fail(path, n.Line, "must be a mapping of keys")
		return
	}
	fields := map[string]int{}
	for i := range v.NumField() {
		f := v.Type().Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if f.IsExported() && name != "" && name != "-" {
			fields[name] = i
		}
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		key := join(path, k.Value)
		switch {
		case k.Kind != yaml.ScalarNode:
			d.fail(join(path, "?"), k.Line, "keys must be plain names")
		case seen[k.Value]:
			d.fail(key, k.Line, "duplicate key")
		case fileSecrets[listIndex().ReplaceAllString(key, "")] != "":
			d.fail(key, k.Line, "a secret may not be written in the config file; %s", fileSecrets[listIndex().ReplaceAllString(key, "")])
		default:
			seen[k.Value] = true
			idx, ok := fields[k.Value]
			if !ok {
				d.fail(key, k.Line, "unknown key")
				continue
			}
			d.decode(val, v.Field(idx), key)
		}
	}
}

// expandValues expands variables in every scalar value under n (not in
// mapping keys). It reports false if a value could not be expanded.
func (d *fileDecoder) expandValues(n *yaml.Node, path string) bool {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if d.expanded[n] {
		return true
	}
	d.expanded[n] = true
	switch n.Kind {
	case yaml.ScalarNode:
		s, err := expand(n.Value, d.env)
		if err != nil {
			d.fail(path, n.Line, "%v", err)
			return false
		}
		if s != n.Value {
			// Re-resolve the tag, so that "${N}" (quoted, as it must be
			// inside a flow mapping) can fill a number. A string field
			// still takes the text as written.
			n.Value = s
			n.Tag = ""
			n.Style &^= yaml.SingleQuotedStyle | yaml.DoubleQuotedStyle
		}
	case yaml.SequenceNode:
		ok := true
		for i, e := range n.Content {
			ok = d.expandValues(e, fmt.Sprintf("%s[%d]", path, i)) && ok
		}
		return ok
	case yaml.MappingNode:
		ok := true
		for i := 0; i+1 < len(n.Content); i += 2 {
			ok = d.expandValues(n.Content[i+1], join(path, n.Content[i].Value)) && ok
		}
		return ok
	}
	return true
}

var varName = lazyRegexp(`^[A-Za-z_][A-Za-z0-9_]*`)

// expand replaces $NAME and ${NAME} with their values from env; $$ is a
// literal $, and a $ followed by anything else is kept. An unset variable
// is an error rather than an empty string, so a missing secret is noticed.
func expand(s string, env map[string]string) (string, error) {
	if !strings.Contains(s, "$") {
		return s, nil
	}
	var b strings.Builder
	for {
		i := strings.IndexByte(s, '$')
		if i < 0 {
			b.WriteString(s)
			return b.String(), nil
		}
		b.WriteString(s[:i])
		s = s[i+1:]
		var name string
		switch {
		case strings.HasPrefix(s, "$"):
			b.WriteByte('$')
			s = s[1:]
			continue
		case strings.HasPrefix(s, "{"):
			end := strings.IndexByte(s, '}')
			if end < 0 {
				return "", errors.New("unterminated ${ in value")
			}
			name = s[1:end]
			if varName().FindString(name) != name {
				return "", fmt.Errorf("bad variable name %q in ${...}", name)
			}
			s = s[end+1:]
		default:
			name = varName().FindString(s)
			if name == "" {
				b.WriteByte('$')
				continue
			}
			s = s[len(name):]
		}
		v, ok := env[name]
		if !ok {
			return "", fmt.Errorf("environment variable %s is not set (write $$ for a literal $)", name)
		}
		b.WriteString(v)
	}
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// describe names what a value of type t must look like in YAML.
func describe(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int64:
		return "a whole number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice:
		return "a list of strings"
	case reflect.Map:
		return "a mapping of names to strings"
	}
	return "a " + t.String()
}

// envMap turns KEY=VALUE strings into a map; a later entry wins, as
// exec.Cmd does with a duplicated key.
func envMap(environ []string) map[string]string {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

// syntaxLine reads the line a YAML syntax error names.
var syntaxLine = lazyRegexp(`^yaml: line (\d+):`)

// syntaxContext says, for a YAML syntax error at a line, which key that
// line is under (by indentation, the dotted path of the keys above it) and,
// for a ${VAR} inside a {...} mapping, how to write it.
func syntaxContext(data []byte, err error) string {
	m := syntaxLine().FindStringSubmatch(err.Error())
	if m == nil {
		return ""
	}
	n, _ := strconv.Atoi(m[1])
	lines := strings.Split(string(data), "\n")
	if n < 1 || n > len(lines) {
		return ""
	}
	// The parser names the line where the construct it could not finish
	// began, or the one before: a line with a ${VAR} in braces, the
	// usual culprit, is taken first.
	i := n - 1
	if i+1 < len(lines) && !unquotedVarInBraces(lines[i]) && unquotedVarInBraces(lines[i+1]) {
		i++
	}
	for i > 0 && strings.TrimSpace(lines[i]) == "" {
		i--
	}
	var path []string
	indent := len(lines[i]) - len(strings.TrimLeft(lines[i], " "))
	if k, _, ok := strings.Cut(strings.TrimSpace(lines[i]), ":"); ok {
		path = append(path, strings.TrimPrefix(k, "- "))
	}
	for j := i - 1; j >= 0 && indent > 0; j-- {
		t := strings.TrimSpace(lines[j])
		in := len(lines[j]) - len(strings.TrimLeft(lines[j], " "))
		if t == "" || strings.HasPrefix(t, "#") || in >= indent {
			continue
		}
		if k, _, ok := strings.Cut(t, ":"); ok {
			path = append([]string{strings.TrimPrefix(k, "- ")}, path...)
		}
		indent = in
	}
	out := ""
	if len(path) > 0 {
		out = fmt.Sprintf(" (in %s)", strings.Join(path, "."))
	}
	if unquotedVarInBraces(lines[i]) {
		out += `; a ${VAR} inside {...} must be quoted: "${VAR}"`
	}
	return out
}

// unquotedVarInBraces reports whether a line holds a ${ not preceded by a
// quote, after a {.
func unquotedVarInBraces(line string) bool {
	open := strings.Index(line, "{")
	v := strings.Index(line, "${")
	return open >= 0 && v > open && line[v-1] != '"' && line[v-1] != '\''
}
