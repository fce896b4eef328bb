// A real OpenID Connect provider (the npm package oidc-provider) on 127.0.0.1 for
// the booking API's token tests (booking-api/tests/oidc_provider.rs).
//
// Tokens: the client_credentials grant with resource indicators, so that the
// provider issues JWT access tokens for the API's audience. The resource picks the
// signing algorithm and lifetime:
//   urn:gpu-booking:RS256, urn:gpu-booking:ES256   audience gpu-booking, 10 minutes
//   urn:gpu-booking:long                           audience gpu-booking, 30 days, RS256
//   urn:other-api:RS256                            audience other-api
// The client picks the identity claims (see CLIENTS). POST /test/rotate replaces the
// signing keys with new ones (new key ids) and keeps the old public keys published,
// as a provider does when it rotates.
//
// Plain http (https would need certificates): the API under test runs with
// --allow-insecure-jwks-url. Prints one JSON line {"issuer": ...} when ready and
// serves until stdin closes or it is killed.
import http from 'node:http';
import { generateKeyPairSync, randomUUID } from 'node:crypto';
import Provider from 'oidc-provider';

const CLIENTS = {
  alice: { email: 'alice@example.com', email_verified: true },
  // Claims Alice's address without the provider having verified it.
  mallory: { email: 'alice@example.com', email_verified: false },
  root: { email: 'root@example.com', email_verified: true, roles: ['admin'] },
  bob: { preferred_username: 'bob', email: 'bob@example.com', email_verified: false },
};
const SECRET = 'test-secret-that-is-long-enough-0123456789';

function keyPair(type) {
  const { privateKey } = type === 'RS256'
    ? generateKeyPairSync('rsa', { modulusLength: 2048 })
    : generateKeyPairSync('ec', { namedCurve: 'P-256' });
  return { ...privateKey.export({ format: 'jwk' }), kid: `${type}-${randomUUID()}`, use: 'sig', alg: type };
}

function resourceServer(resource) {
  const [, api, kind] = /^urn:([a-z-]+):([A-Za-z0-9]+)$/.exec(resource) ?? [];
  if (!api) throw new Error(`unknown resource ${resource}`);
  return {
    scope: 'api',
    audience: api,
    accessTokenTTL: kind === 'long' ? 30 * 24 * 3600 : 600,
    accessTokenFormat: 'jwt',
    jwt: { sign: { alg: kind === 'ES256' ? 'ES256' : 'RS256' } },
  };
}

function makeProvider(issuer, keys) {
  return new Provider(issuer, {
    jwks: { keys },
    clients: Object.keys(CLIENTS).map((id) => ({
      client_id: id,
      client_secret: SECRET,
      grant_types: ['client_credentials'],
      redirect_uris: [],
      response_types: [],
    })),
    features: {
      devInteractions: { enabled: false },
      clientCredentials: { enabled: true },
      resourceIndicators: {
        enabled: true,
        defaultResource: () => 'urn:gpu-booking:RS256',
        getResourceServerInfo: (ctx, resource) => resourceServer(resource),
        useGrantedResource: () => true,
      },
    },
    extraTokenClaims: (ctx, token) => CLIENTS[token.clientId] ?? {},
  });
}

// Signing keys first (the provider signs with the first key of an algorithm), the
// previous ones after them.
let keys = [keyPair('RS256'), keyPair('ES256')];
let provider;
const server = http.createServer((req, res) => {
  if (req.method === 'POST' && req.url === '/test/rotate') {
    keys = [keyPair('RS256'), keyPair('ES256'), ...keys];
    provider = makeProvider(provider.issuer, keys);
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ kids: keys.map((k) => k.kid) }));
    return;
  }
  provider.callback()(req, res);
});
server.listen(Number(process.env.PORT ?? 0), '127.0.0.1', () => {
  const issuer = `http://127.0.0.1:${server.address().port}`;
  provider = makeProvider(issuer, keys);
  process.stdout.write(`${JSON.stringify({ issuer })}\n`);
});
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
