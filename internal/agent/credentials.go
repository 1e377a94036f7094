package agent

import "strings"

// Key is how an agent sends one of its API keys to its model API: what
// the egress needs to add the key in the sandbox's stead, so that the key
// never enters the sandbox.
type Key struct {
	// Var is the variable that holds the key (ANTHROPIC_API_KEY).
	Var string
	// Header is the request header the key goes in; with Bearer, as
	// "Bearer " + the key.
	Header string
	Bearer bool
	// BaseURL is the variable that points the agent at another endpoint
	// than the API's own, Default.
	BaseURL, Default string
}

// KeyPlaceholder is what a sandbox holds in place of an API key the egress
// adds: a CLI that insists on its variable being set finds it set.
const KeyPlaceholder = "corral-egress-adds-this-key"

// ModelAPI is one model API a task's agent reaches through the egress:
// the worker points BaseURLVar at its relay on the sandbox's loopback, and
// the egress sends the relay's requests to Base with Header: Value added.
type ModelAPI struct {
	BaseURLVar    string
	Base          string
	Header, Value string
}

// ModelAPIs splits an agent's configured environment (KEY=value) for a
// sandbox whose egress adds the agent's keys: env is what the sandbox gets,
// with every key of Keys replaced by KeyPlaceholder and every base URL
// variable of theirs left out (the worker sets it); apis are the model
// APIs to relay, one per base URL variable, with the first of its keys
// that is set. Variables of AnyOf that are not keys (a whole
// configuration, OPENCODE_CONFIG_CONTENT) stay as they are.
func (c Credentials) ModelAPIs(configured []string) (env []string, apis []ModelAPI) {
	values := map[string]string{}
	for _, kv := range configured {
		k, v, _ := strings.Cut(kv, "=")
		values[k] = v
	}
	keyVars, baseVars := map[string]bool{}, map[string]bool{}
	for _, k := range c.Keys {
		keyVars[k.Var], baseVars[k.BaseURL] = true, true
	}
	for _, kv := range configured {
		k, v, _ := strings.Cut(kv, "=")
		switch {
		case keyVars[k]:
			if v != "" { // an empty one stays unset, as a CLI would take it
				env = append(env, k+"="+KeyPlaceholder)
			}
		case !baseVars[k]:
			env = append(env, kv)
		}
	}
	relayed := map[string]bool{}
	for _, k := range c.Keys {
		v := values[k.Var]
		if v == "" || relayed[k.BaseURL] {
			continue
		}
		relayed[k.BaseURL] = true
		base := values[k.BaseURL]
		if base == "" {
			base = k.Default
		}
		if k.Bearer {
			v = "Bearer " + v
		}
		apis = append(apis, ModelAPI{BaseURLVar: k.BaseURL, Base: base, Header: k.Header, Value: v})
	}
	return env, apis
}
