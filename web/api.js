// Requests to the server's API, carrying the access token when the server asks for one.
// The token is kept in sessionStorage: it lasts as long as this tab and is never written to
// disk for other tabs or later visits, as localStorage would.

const TOKEN_KEY = "cosyrtc.accessToken";

// The server refused the token (403) or wants one (401); the page asks for it again.
export class AuthError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function isAuthFailure(status) {
  return status === 401 || status === 403;
}

let token = readStoredToken();

function readStoredToken() {
  try {
    return sessionStorage.getItem(TOKEN_KEY) ?? "";
  } catch {
    return ""; // storage disabled: the token lasts until the page reloads
  }
}

export function accessToken() {
  return token;
}

export function setAccessToken(value) {
  token = value;
  try {
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch {
    // storage disabled: kept in memory only
  }
}

// fetch() with "Authorization: Bearer <token>" added once a token has been given.
export function api(path, init = {}) {
  const headers = new Headers(init.headers);
  if (token) headers.set("Authorization", `Bearer ${token}`);
  return fetch(path, { ...init, headers });
}
