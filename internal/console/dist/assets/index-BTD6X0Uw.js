var e,t,n,r,i,a,o,s,c,l,u=Symbol.for(`pv`),d={},f=[],p=/^m(i|n|o|s|text|space)$/,m=Array.isArray,h=f.slice,g=Object.assign;function _(e){e&&e.parentNode&&e.remove()}function v(e,t,n){var r,i,a,o={},s=arguments.length;for(a in t)a==`key`?r=t[a]:a==`ref`&&typeof e!=`function`?i=t[a]:o[a]=t[a];return s>2&&(o.children=s>3?h.call(arguments,2):n),y(e,o,r,i,null)}function y(n,r,i,a,o){var s={type:n,props:r,key:i,ref:a,__k:null,__:null,__b:0,__e:null,__c:null,constructor:u,__v:o||++t,__i:-1,__u:0};return!o&&e.vnode&&e.vnode(s),s}function b(e){return e.children}function x(e,t){this.props=e,this.context=t,this.__g=0}function S(e,t){if(t==null)return e.__&&S(e.__,e.__i+1);for(var n;t<e.__k.length;t++)if((n=e.__k[t])&&n.__e)return n.__e;return typeof e.type!=`function`||e.props.__P?null:S(e)}function C(t){var n,r=t.__v,i=r.__e,a=[],o=[],s=t.__P;s&&((n=g({constructor:u},r)).__v=r.__v+1,e.vnode&&e.vnode(n),N(s,n,r,t.__n,s.namespaceURI,32&r.__u?[i]:null,a,i||S(r),32&r.__u,o),n.__v=r.__v,n.__.__k[n.__i]=n,F(a,n,o),r.__=r.__e=null,n.__e!=i&&w(n))}function w(e){if((e=e.__)&&e.__c&&!e.props.__P)return e.__e=null,e.__k.some(function(t){return t&&(e.__e=t.__e)}),w(e)}function T(t){(8&t.__g||(t.__g|=8,n.push(t),i++))&&r==e.debounceRendering||((r=e.debounceRendering)||queueMicrotask)(E)}function E(){try{for(var e,t=1;n.length;)n.length>t&&n.sort(a),e=n.shift(),t=n.length,8&e.__g&&C(e)}finally{(i=n.length)&&(r||queueMicrotask)(E)}}function ee(e,t,n,r,i,a,o,s,c,l,u){var p,m,h,g,_,v,y=r.__k||f,b=t.length;for(c=D(n,t,y,c,b),p=0;p<b;p++)(h=n.__k[p])!=null&&(m=~h.__i&&y[h.__i]||d,h.__i=p,v=N(e,h,m,i,a,o,s,c,l,u),g=h.__e,(m.ref!=h.ref||8&m.__u)&&(m.ref&&I(m.ref,null,h,m),h.ref&&u.push(h.ref,h.__c||g,h)),_||=g,4&h.__u?(c=O(h,c,e,!m.__v),m.__e&&(m.__e=null)):typeof h.type==`function`&&v!==void 0?c=v:g&&(c=g.nextSibling),h.__u&=-21);return n.__e=_,c}function D(e,t,n,r,i){var a,o,s,c,l,d,f,p,h,g=n.length,_=g,v=0,x=0,C=e.__k=Array(i);for(a=0;a<i;a++)(o=t[a])!=null&&typeof o!=`boolean`&&typeof o!=`function`?(typeof o!=`object`||o.constructor===String?o=C[a]=y(null,o):m(o)?o=C[a]=y(b,{children:o}):o.constructor===u&&o.__b?o=C[a]=y(o.type,o.props,o.key,o.ref,o.__v):C[a]=o,c=a+v,o.__=e,o.__b=e.__b+1,s=null,~(l=o.__i=k(o,n,c,_))&&(_--,(s=n[l])&&(s.__u|=2)),s&&s.__v?(o.__u|=16,l==c-1?v--:l==c+1?v++:l!=c&&(l>c?v--:v++,x=1)):(~l||(i>g?v--:i<g&&v++),typeof o.type!=`function`&&(o.__u|=4))):C[a]=null;if(x){for(d=[],f=[],a=0;a<i;a++)if((o=C[a])&&16&o.__u){for(v=0,p=d.length;v<p;)d[h=v+p>>1]<o.__i?v=h+1:p=h;d[v]=o.__i,f[a]=v+1}for(v=d.length;a--;)f[a]&&(f[a]==v?v--:C[a].__u|=4)}if(_)for(a=0;a<g;a++)!(s=n[a])||2&s.__u||(s.__e==r&&(r=S(s)),re(s,s));return r}function O(e,t,n,r){var i,a,o,s;if(typeof e.type==`function`){if(e.props.__P)return t;if(i=e.__k)for(a=0;a<i.length;a++)i[a]&&(i[a].__=e,t=O(i[a],t,n,!1));return t}for(t&&!t.parentNode&&(t=S(e))&&!t.parentNode&&(t=null),o=e.__e,s=t;s&&s.nodeType==8;)s=s.nextSibling;for(o!=s&&(!r&&n.moveBefore&&o.parentNode?n.moveBefore(o,t):n.insertBefore(o,t||null)),t=o;(t&&=t.nextSibling)&&t.nodeType==8&&!t.data.startsWith(`$s`););return t}function k(e,t,n,r){var i,a=e.key,o=e.type,s=t[n],c=s&&!(2&s.__u);if(s===null&&a==null||c&&a==s.key&&o==s.type)return n;if(r>+!!c){for(i=n-1;i>=0;i--)if((s=t[i])&&!(2&s.__u)&&a==s.key&&o==s.type)return i;for(i=n+1;i<t.length;i++)if((s=t[i])&&!(2&s.__u)&&a==s.key&&o==s.type)return i}return-1}function A(e,t,n){n??=``,t[0]==`-`?e.setProperty(t,n):e[t]=n}function j(e,t,n,r,i){var a,o;if(t==`style`){if(typeof n==`string`)e.style.cssText=n;else{if(typeof r==`string`&&(e.style.cssText=r=``),r)for(t in r)n&&t in n||A(e.style,t);if(n)for(t in n)r&&n[t]==r[t]||A(e.style,t,n[t])}}else if(t[0]==`o`&&t[1]==`n`)typeof n!=`function`&&(n=null),typeof r!=`function`&&(r=null),(e.__e||={})[t]=n,n&&r||(o=l[t]||(l[t]=M(t)),(e.__a||={})[t]=c,a=t!=(t=t.replace(s,`$1`)),(t=t.slice(2))[0]<`a`&&(t=t.toLowerCase()),n?e.addEventListener(t,o,a):e.removeEventListener(t,o,a));else{if(i==`http://www.w3.org/2000/svg`)t=t.replace(/xlink(H|:h)/,`h`).replace(/sName$/,`s`);else if(t!=`width`&&t!=`height`&&t!=`href`&&t!=`list`&&t!=`form`&&t!=`tabIndex`&&t!=`download`&&t!=`rowSpan`&&t!=`colSpan`&&t!=`role`&&t!=`popover`&&t in e)try{e[t]=n??``;return}catch{}if(typeof n==`function`)return;n==null||!1===n&&t[4]!=`-`?e.removeAttribute(t):e.setAttribute(t,t==`popover`&&n==1?``:n)}}function M(t){return function(n){var r=this.__e;if(r){if(r=r[t],n[o]==null)n[o]=c++;else if(n[o]<this.__a[t])return;return r(e.event?e.event(n):n)}}}function N(t,n,r,i,a,o,s,c,l,d){var p,h,v,y,C,w,T,E,D,O,k,A,j,M,N,F,I,L,R=n.type;if(n.constructor!==u)return null;128&r.__u&&(l=32&r.__u,p=r.__c.__z)&&(n.__u|=l,h=o=[],p.nodeType==8?c=P(p,o):o.push(p),c=o[0]||c),(p=e.__b)&&p(n);e:if(typeof R==`function`){v=s.length;try{if(E=n.props,D=(p=R.prototype)&&p.render,O=(p=R.contextType)&&i[p.__c],k=p?O?O.props.value:p.__:i,(y=r.__c)?(n.__c=y,2&y.__g&&(y.__g|=1)):(D?n.__c=y=new R(E,k):(n.__c=y=new x(E,k),y.constructor=R,y.render=ie),O&&O.sub(y),y.state||(y.state={}),y.__n=i,y.__g|=8,y.__h=[],y.__k=[]),D&&(y.__s||(y.__s=y.state),R.getDerivedStateFromProps&&(y.__s==y.state&&(y.__s=g({},y.__s)),g(y.__s,R.getDerivedStateFromProps(E,y.__s)))),C=y.props,w=y.state,y.__v=n,r.__c){if(E!==C&&D&&!R.getDerivedStateFromProps&&y.componentWillReceiveProps&&y.componentWillReceiveProps(E,k),n.__v==r.__v&&!(8&y.__g)||!(4&y.__g)&&y.shouldComponentUpdate&&!1===y.shouldComponentUpdate(E,y.__s,k)){n.__v!=r.__v&&(y.props=E,y.state=y.__s,y.__g&=-9),n.__e=r.__e,n.__k=r.__k,n.__k.some(function(e){e&&(e.__=n)}),f.push.apply(y.__h,y.__k),y.__k=[],y.__h.length&&s.push(y),c=S(r);break e}y.componentWillUpdate&&y.componentWillUpdate(E,y.__s,k),D&&y.componentDidUpdate&&y.__h.push(function(){y.componentDidUpdate(C,w,T)})}else D&&!R.getDerivedStateFromProps&&y.componentWillMount&&y.componentWillMount(),D&&y.componentDidMount&&y.__h.push(y.componentDidMount);y.context=k,y.props=E,y.__P=t,y.__g&=-5,A=e.__r,j=D?25:0;do y.__g&=-9,A&&A(n),p=y.render(y.props,y.state=y.__s,y.context);while(8&y.__g&&++j<25);D&&(f.push.apply(y.__h,y.__k),y.__k=[]),y.state=y.__s,y.getChildContext&&(i=g({},i,y.getChildContext())),D&&r.__c&&y.getSnapshotBeforeUpdate&&(T=y.getSnapshotBeforeUpdate(C,w)),M=p&&p.type===b&&p.key==null?p.props.children:p,E.__P&&(p=c,a=(t=E.__P).namespaceURI,l=o=null,r.props&&r.props.__P!=t&&(r.__k.some(function(e){e&&re(e,e)}),r.__k=null),c=r.__k?S(r,0):null),c=ee(t,m(M)?M:[M],n,r,i,a,o,s,c,l,d),E.__P&&(n.__e=null,c=p),n.__u&=-161,h&&h.some(_),y.__h.length&&s.push(y),1&y.__g&&(y.__g&=-4)}catch(t){if(s.length=v,n.__v=null,l||o){if(t&&t.then){if(n.__u|=128|l,o){for(~(I=o.indexOf(c||void 0))||(I=o.length);(L=o[I-1])&&L.nodeType==8;)I--;for(;I<o.length;I++)if(L=o[I]){if(o[I]=null,N){if(L==F)break}else{if(L.nodeType!=8)break;L.data.startsWith(`$s`)&&(F=P(N=L))}}}if(!N){for(;c&&c.nodeType==8&&c.nextSibling;)c=c.nextSibling;N=c}(p=P(N=n.__c.__z||(n.__c.__z=N)))?(n.__e=N,c=p):n.__e=c,c&&=c.nextSibling}else o&&o.some(_)}else n.__e=r.__e;n.__k||=r.__k||[],t&&t.then||te(n),e.__e(t,n,r)}}else c=n.__e=ne(r.__e,n,r,i,a,o,s,l,d,t);return(p=e.diffed)&&p(n),c}function P(e,t){if(e&&e.nodeType==8&&e.data.startsWith(`$s`))for(var n=1;e=e.nextSibling;){if(e.nodeType==8){if(e.data.startsWith(`$s`))n++;else if(e.data.startsWith(`/$s`)&&!--n)return e}t&&t.push(e)}}function te(e){e&&(e.__c&&(e.__c.__g|=4),e.__k&&e.__k.some(te))}function F(t,n,r){for(var i=0;i<r.length;)I(r[i++],r[i++],r[i++]);e.__c&&e.__c(n,t),t.some(function(n){try{t=n.__h,n.__h=[],t.some(function(e){e.call(n)})}catch(t){e.__e(t,n.__v)}})}function ne(t,n,r,i,a,o,s,c,l,u){var f,g,v,y,b,x,C,w,T=r.props||d,E=n.props,D=n.type;if(D==`svg`?a=`http://www.w3.org/2000/svg`:D==`math`?a=`http://www.w3.org/1998/Math/MathML`:a||=`http://www.w3.org/1999/xhtml`,o){for(f=0;f<o.length;f++)if((b=o[f])&&(D?b.localName==D:b.nodeType==3)){t=b,o[f]=null;break}}if(!t){if(w=u.ownerDocument||document,!D)return w.createTextNode(E);t=w.createElementNS(a,D,E.is?E:u),c&&=(e.__m&&e.__m(n,o),!1),o=null}if(D){if(u=D==`template`&&t.content||t,o=D==`textarea`&&E.defaultValue!=null?null:o&&h.call(u.childNodes),!c&&o)for(T={},f=0;f<t.attributes.length;f++)T[(b=t.attributes[f]).name]=b.value;for(f in T)b=T[f],f==`dangerouslySetInnerHTML`?v=b:f==`children`||f in E||f==`value`&&`defaultValue`in E||f==`checked`&&`defaultChecked`in E||j(t,f,null,b,a);for(f in E)b=E[f],f==`children`?y=b:f==`dangerouslySetInnerHTML`?g=b:f==`value`?x=b:f==`checked`?C=b:c&&typeof b!=`function`||T[f]===b||j(t,f,b,T[f],a);g?(c||v&&(g.__html==v.__html||g.__html==t.innerHTML)||(t.innerHTML=g.__html),n.__k=[]):(v&&(t.textContent=``),(D==`foreignObject`||a==`http://www.w3.org/1998/Math/MathML`&&p.test(D))&&(a=`http://www.w3.org/1999/xhtml`),ee(u,m(y)?y:[y],n,r,i,a,o,s,o?o[0]:r.__k&&S(r,0),c,l),o&&o.some(_)),c&&D!=`textarea`||(f=`value`,D==`progress`&&x==null?t.removeAttribute(f):x==null||x===t[f]&&(D!=`progress`||x)||j(t,f,x,T[f],a),f=`checked`,C!=null&&C!=t[f]&&j(t,f,C,T[f],a))}else T===E||c&&t.data==E||(t.data=E);return t}function I(t,n,r,i){try{typeof t==`function`?n?n.__x=t(n)||1:(i&&=i.__c||i.__e)&&(n=i.__x)&&(i.__x=null,typeof n==`function`?n():t(null)):t.current=n}catch(t){e.__e(t,r)}}function re(t,n,r){var i,a,o,s;if(e.unmount&&e.unmount(t),!(i=t.ref)||i.current&&i.current!=t.__e||I(i,null,n,t),i=t.__c){if(i.componentWillUnmount)try{i.componentWillUnmount()}catch(t){e.__e(t,n)}i.__P=i.__n=null}if(i=t.__k)for(s=0;s<i.length;s++)i[s]&&re(i[s],n,typeof t.type!=`function`||r&&!t.props.__P);!r&&(i=t.__c)&&(i=i.__z)&&(a=P(i,o=[]))&&(i==t.__e&&o.some(_),_(a),_(i)),r||_(t.__e),t.__e=t.__c=t.__=null}function ie(e,t,n){return this.constructor(e,n)}function L(t,n){var r,i,a,o;e.__&&e.__(t,n),n.nodeType==9&&(n=n.documentElement),i=(r=t&&32&t.__u)?null:n.__k,n.__k=y(b,{children:[t]}),a=[],o=[],N(n,n.__k,i||d,d,n.namespaceURI,i?null:n.firstChild?h.call(n.childNodes):null,a,i?i.__e:n.firstChild,r,o),F(a,n.__k,o),n.__k.props.children=null}e={__e:function(e,t,n,r){for(var a,o,s;t=t.__;)if((a=t.__c)&&!(1&a.__g)){a.__g|=4;try{if((s=(o=a.constructor)&&o.getDerivedStateFromError)&&a.setState(o.getDerivedStateFromError(e)),a.componentDidCatch&&(a.componentDidCatch(e,r||{}),s=1),s&&8&a.__g)return void(a.__g|=2)}catch(t){e=t}}throw i=0,e}},t=0,x.prototype.setState=function(e,t){var n=this.__s;n&&n!=this.state||(n=this.__s=g({},this.state)),typeof e==`function`&&(e=e(g({},n),this.props)),e&&(g(n,e),this.__v&&(t&&this.__k.push(t),T(this)))},x.prototype.forceUpdate=function(e){this.__v&&(this.__g|=4,e&&this.__h.push(e),T(this))},x.prototype.render=b,n=[],i=0,a=function(e,t){return e.__v.__b-t.__v.__b},o=Symbol(),s=/(PointerCapture)$|Capture$/i,c=0,l={};var R,z,ae,oe,se=Object.is,B=0,ce=[],le=[],V=e,ue=V.__b,de=V.__r,fe=V.diffed,pe=V.__c,me=V.unmount,he=V.__;function ge(e,t){V.__h&&V.__h(z,e,B||t),B=0;var n=z.__H||(z.__H={__:[],__h:[]});return e>=n.__.length&&n.__.push({}),n.__[e]}function H(e){return B=1,_e(Ee,e)}function _e(e,t,n){var r=ge(R++,2);if(r.t=e,!r.__c&&(r.__=[n?n(t):Ee(void 0,t),function(e){var t=(r.__N||r.__)[0],n=r.t(t,e);se(t,n)||(r.__N=[n,r.__[1]],r.__c.setState({}))}],r.__c=z,!z.__f)){z.__f=!0;var i=z.shouldComponentUpdate;z.shouldComponentUpdate=function(e,t,n){var r=this.__H;if(!r)return!0;var a=!1,o=this.props!=e;if(r.__.some(function(e){e.__N&&(a=!0,se(e.__[0],e.__N[0])||(o=!0))}),i){var s=i.call(this,e,t,n);return a?s||o:s}return!a||o}}return r.__}function U(e,t){var n=ge(R++,3);!V.__s&&Te(n.__H,t)&&(n.__P=!0,n.__=e,n.u=t,z.__H.__h.push(n))}function ve(e){return B=5,ye(function(){return{current:e}},[])}function ye(e,t){var n=ge(R++,7);return Te(n.__H,t)&&(n.__=e(),n.__H=t),n.__}function be(){var e;do{for(;e=le.shift();)try{W(e)}catch(t){V.__e(t,{__:(e=e.__P)&&e.__v})}for(;e=ce.shift();){var t=e.__H;if(e.__P&&t)try{t.__h.some(W),t.__h.some(we),t.__h=[]}catch(n){t.__h=[],V.__e(n,e.__v)}}}while(le.length)}V.__b=function(e){z=null,ue&&ue(e)},V.__=function(e,t){e&&t.__k&&t.__k.__m&&(e.__m=t.__k.__m),he&&he(e,t)},V.__r=function(e){de&&de(e),R=0;var t=(z=e.__c).__H;t&&(ae==z?z.__h=[]:(t.__h.some(W),t.__h.some(we),R=0),t.__h=[],t.__.some(function(e){e.__N&&(e.__=e.__N),e.u=e.__N=void 0})),ae=z},V.diffed=function(e){fe&&fe(e);var t=e.__c;t&&t.__H&&(t.__H.__h.length&&Ce(ce.push(t)),t.__H.__.some(function(e){e.u&&(e.__H=e.u)})),ae=z=null},V.__c=function(e,t){t.some(function(e){try{e.__h.some(W),e.__h=e.__h.filter(function(e){return!e.__||we(e)})}catch(t){e.__h=[function(){throw t}]}}),pe&&pe(e,t)},V.unmount=function(e){me&&me(e);var t,n,r=e.__c;r&&r.__H&&(r.__H.__.some(function(r){try{if(r.__P&&r.__c){if(n===void 0){for(n=e.__;n&&(!n.__c||!n.__c.__P);)n=n.__;n&&=n.__c}r.__P=n,Ce(le.push(r))}else W(r)}catch(e){t=e}}),r.__H=void 0,t&&V.__e(t,r.__v))};var xe=typeof requestAnimationFrame==`function`;function Se(e){var t,n=function(){clearTimeout(r),xe&&cancelAnimationFrame(t),setTimeout(e)},r=setTimeout(n,35);xe&&(t=requestAnimationFrame(n))}function Ce(e){e!=1&&oe==V.requestAnimationFrame||((oe=V.requestAnimationFrame)||Se)(be)}function W(e){var t=z,n=e.__c;typeof n==`function`&&(e.__c=void 0,n()),z=t}function we(e){var t=z;e.__c=e.__(),z=t}function Te(e,t){return!e||e.length!=t.length||t.some(function(t,n){return!se(t,e[n])})}function Ee(e,t){return typeof t==`function`?t(e):t}var De=`quiver.token`;function Oe(){return sessionStorage.getItem(De)}function ke(e){e===null?sessionStorage.removeItem(De):sessionStorage.setItem(De,e)}var Ae=class extends Error{constructor(e,t,n,r){super(n),this.status=e,this.code=t,this.field=r}};async function G(e,t,n,r=Oe()){let i={};r&&(i.Authorization=`Bearer `+r),n!==void 0&&(i[`Content-Type`]=`application/json`);let a;try{a=await fetch(t,{method:e,headers:i,body:n===void 0?void 0:JSON.stringify(n),credentials:`omit`})}catch(e){throw new Ae(0,`Unreachable`,`the server did not answer: `+e.message)}if(a.status===204)return null;let o=await a.text(),s=null;try{s=o?JSON.parse(o):null}catch{s=null}if(!a.ok){let e=s&&s.error;throw e?new Ae(a.status,e.code,e.message,e.field):new Ae(a.status,`HTTP `+a.status,o.trim()||a.statusText)}return s}var K=encodeURIComponent,q={whoami:e=>G(`GET`,`/v1/whoami`,void 0,e),version:()=>G(`GET`,`/v1/version`),pool:()=>G(`GET`,`/v1/pool`),nodes:()=>G(`GET`,`/v1/nodes`),jobs:()=>G(`GET`,`/v1/jobs`),volumes:()=>G(`GET`,`/v1/volumes`),volume:e=>G(`GET`,`/v1/volumes/${K(e)}`),createVolume:e=>G(`POST`,`/v1/volumes`,e),deleteVolume:(e,t)=>G(`DELETE`,`/v1/volumes/${K(e)}`+(t?`?recursive=true`:``)),snapshots:e=>G(`GET`,`/v1/volumes/${K(e)}/snapshots`),createSnapshot:(e,t)=>G(`POST`,`/v1/volumes/${K(e)}/snapshots`,{name:t}),deleteSnapshot:(e,t)=>G(`DELETE`,`/v1/volumes/${K(e)}/snapshots/${K(t)}`),rollback:(e,t)=>G(`POST`,`/v1/volumes/${K(e)}/rollback`,{snapshot:t}),clone:(e,t)=>G(`POST`,`/v1/clones`,{source:e,names:t}),attachments:e=>G(`GET`,`/v1/volumes/${K(e)}/attachments`),ready:async()=>(await fetch(`/readyz`,{credentials:`omit`})).ok},je=function(e,t,n,r){var i;t[0]=0;for(var a=1;a<t.length;a++){var o=t[a++],s=t[a]?(t[0]|=o?1:2,n[t[a++]]):t[++a];o===3?r[0]=s:o===4?r[1]=Object.assign(r[1]||{},s):o===5?(r[1]=r[1]||{})[t[++a]]=s:o===6?r[1][t[++a]]+=s+``:o?(i=e.apply(s,je(e,s,n,[``,null])),r.push(i),s[0]?t[0]|=2:(t[a-2]=0,t[a]=i)):r.push(s)}return r},Me=new Map;function Ne(e){var t=Me.get(this);return t||(t=new Map,Me.set(this,t)),(t=je(this,t.get(e)||(t.set(e,t=function(e){for(var t,n,r=1,i=``,a=``,o=[0],s=function(e){r===1&&(e||(i=i.replace(/^\s*\n\s*|\s*\n\s*$/g,``)))?o.push(0,e,i):r===3&&(e||i)?(o.push(3,e,i),r=2):r===2&&i===`...`&&e?o.push(4,e,0):r===2&&i&&!e?o.push(5,0,!0,i):r>=5&&((i||!e&&r===5)&&(o.push(r,0,i,n),r=6),e&&(o.push(r,e,0,n),r=6)),i=``},c=0;c<e.length;c++){c&&(r===1&&s(),s(c));for(var l=0;l<e[c].length;l++)t=e[c][l],r===1?t===`<`?(s(),o=[o],r=3):i+=t:r===4?i===`--`&&t===`>`?(r=1,i=``):i=t+i[0]:a?t===a?a=``:i+=t:t===`"`||t===`'`?a=t:t===`>`?(s(),r=1):r&&(t===`=`?(r=5,n=i,i=``):t===`/`&&(r<5||e[c][l+1]===`>`)?(s(),r===3&&(o=o[0]),r=o,(o=o[0]).push(2,0,r),r=0):t===` `||t===`	`||t===`
`||t===`\r`?(s(),r=2):i+=t),r===3&&i===`!--`&&(r=4,o=o[0])}return s(),o}(e)),t),arguments,[])).length>1?t:t[0]}var J=Ne.bind(v);function Y({error:e}){return e?J`<div class="error" role="alert">
    ${e.code?J`<strong>${e.code}</strong>: `:``}${e.message}
  </div>`:null}function X({label:e,title:t,danger:n,fields:r=[],confirm:i,run:a,done:o,id:s}){let[c,l]=H(!1),[u,d]=H({}),[f,p]=H(!1),[m,h]=H(null);return J`
    <button class=${n?`danger`:``} data-action=${s} onClick=${()=>{let e={};for(let t of r)e[t.name]=t.initial??(t.type!==`checkbox`&&``);d(e),h(null),l(!0)}}>${e}</button>
    ${c&&J`<div class="backdrop">
      <form class="dialog" role="dialog" aria-label=${t} data-dialog=${s} onSubmit=${async e=>{e.preventDefault(),p(!0),h(null);try{let e=await a(u);l(!1),o&&o(e,u)}catch(e){h(e)}finally{p(!1)}}}>
        <h3>${t}</h3>
        ${r.map(e=>J`<label>
            ${e.label}
            ${e.type===`checkbox`?J`<input
                  type="checkbox"
                  name=${e.name}
                  checked=${u[e.name]}
                  onChange=${t=>d({...u,[e.name]:t.target.checked})}
                />`:e.options?J`<select
                    name=${e.name}
                    value=${u[e.name]}
                    onChange=${t=>d({...u,[e.name]:t.target.value})}
                  >
                    ${e.options.map(e=>J`<option value=${e}>${e}</option>`)}
                  </select>`:J`<input
                    name=${e.name}
                    placeholder=${e.placeholder||``}
                    value=${u[e.name]}
                    onInput=${t=>d({...u,[e.name]:t.target.value})}
                  />`}
          </label>`)}
        ${i&&J`<p class="confirm">${typeof i==`function`?i(u):i}</p>`}
        <${Y} error=${m} />
        <div class="buttons">
          <button type="button" onClick=${()=>l(!1)}>Cancel</button>
          <button type="submit" class=${n?`danger`:`primary`} name="confirm" disabled=${f}>
            ${f?`Working…`:e}
          </button>
        </div>
      </form>
    </div>`}
  `}function Pe({used:e,total:t}){let n=t>0?Math.min(100,100*e/t):0;return J`<div class="meter" title=${n.toFixed(1)+`%`}>
    <div style=${{width:n+`%`}}></div>
  </div>`}var Fe=[`B`,`KiB`,`MiB`,`GiB`,`TiB`,`PiB`];function Z(e){if(e==null)return``;let t=0,n=e;for(;Math.abs(n)>=1024&&t<Fe.length-1;)n/=1024,t++;return(t===0?String(n):n.toFixed(n<10?2:1))+` `+Fe[t]}var Ie=0x40000000;function Le(e){let t=/^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$/i.exec(e);if(!t)return NaN;let n={"":Ie,K:1024,M:1024**2,G:Ie,T:1024*Ie}[t[2].toUpperCase()];return Math.round(parseFloat(t[1])*n/512)*512}function Q(e){if(!e)return``;let t=new Date(e);return isNaN(t)?e:t.toISOString().replace(`T`,` `).replace(/\.\d+Z$/,`Z`)}function Re(e){return e?Object.keys(e).sort().map(t=>`${t}=${e[t]}`).join(`, `):``}function ze(){let[e,t]=H(null),[n,r]=H(null),[i,a]=H(null),[o,s]=H(null),[c,l]=H(null),[u,d]=H(null);if(U(()=>{q.pool().then(t,d),q.nodes().then(e=>r(e.items),e=>r(e)),q.ready().then(a,()=>a(!1)),q.version().then(s,()=>{}),q.jobs().then(e=>l(e.items),()=>l([]))},[]),u)return J`<${Y} error=${u} />`;if(!e)return J`<p class="loading">Loading…</p>`;let f=e.totalBytes-e.freeBytes,p=e.totalBytes>0?e.provisionedBytes/e.totalBytes:0,m=(c||[]).filter(e=>e.state===`running`);return J`<section class="overview">
    <h2>Overview</h2>
    <div class="cards">
      <div class="card" data-card="health">
        <h3>Health</h3>
        <p class=${i?`ok`:`bad`}>${i===null?`…`:i?`Ready`:`Not ready`}</p>
        ${e.readOnly&&J`<p class="bad">Pool is read-only</p>`}
        ${e.broken>0&&J`<p class="bad">${e.broken} volume(s) quarantined</p>`}
        ${o&&J`<p class="dim">quiver ${o.version}</p>`}
      </div>
      <div class="card" data-card="capacity">
        <h3>Capacity</h3>
        <${Pe} used=${f} total=${e.totalBytes} />
        <p>${Z(f)} used of ${Z(e.totalBytes)} (${Z(e.freeBytes)} free)</p>
        <p>
          ${Z(e.provisionedBytes)+` provisioned: `}
          <span class=${p>1?`warn`:``}>${p.toFixed(2)}× overcommit</span>
        </p>
        <p>${e.filesystem} at ${e.path}</p>
      </div>
      <div class="card" data-card="volumes">
        <h3>Volumes</h3>
        <p class="big"><a href="#/volumes">${e.volumes}</a></p>
        ${e.tenant&&J`<p>tenant ${e.tenant.name}</p>`}
        <p>${m.length} job(s) running</p>
      </div>
    </div>
    ${e.clusterPool&&J`<p>
      Cluster ${e.cluster}: ${Z(e.clusterPool.totalBytes-e.clusterPool.freeBytes)} used of
      ${Z(e.clusterPool.totalBytes)}, ${e.clusterPool.volumes} volumes
    </p>`}
    <h3>Nodes</h3>
    ${n===null?J`<p class="loading">Loading…</p>`:n instanceof Error?J`<p class="dim" data-nodes="hidden">Not visible to this token (${n.code}).</p>`:J`<table class="grid">
            <thead>
              <tr><th>Name</th><th>State</th><th>Address</th><th>Capacity</th><th>Free</th><th>Volumes</th></tr>
            </thead>
            <tbody>
              ${n.map(e=>J`<tr data-node=${e.name}>
                  <td>${e.name}${e.self?` (this node)`:``}</td>
                  <td class=${e.state===`up`||e.state===`local`?`ok`:`bad`}>
                    ${e.state}${e.drain?`, `+e.drain:``}
                  </td>
                  <td>${e.address}</td>
                  <td>${Z(e.capacityBytes)}</td>
                  <td>${Z(e.freeBytes)}</td>
                  <td>${e.volumes}</td>
                </tr>`)}
            </tbody>
          </table>`}
  </section>`}var $=34,Be=10,Ve=[{key:`name`,label:`Name`,value:e=>e.name},{key:`disks`,label:`Disks`,value:e=>(e.disks||[]).length},{key:`size`,label:`Size`,value:e=>He(e),show:e=>Z(He(e))},{key:`capacity`,label:`Capacity`,value:e=>e.capacity||0,show:e=>Z(e.capacity)},{key:`snapshots`,label:`Snapshots`,value:e=>e.snapshots||0},{key:`labels`,label:`Labels`,value:e=>Re(e.labels)},{key:`created`,label:`Created`,value:e=>e.createdAt||``,show:e=>Q(e.createdAt)}];function He(e){return(e.disks||[]).reduce((e,t)=>e+t.size,0)}function Ue({canWrite:e}){let[t,n]=H(null),[r,i]=H(null),[a,o]=H(``),[s,c]=H({key:`name`,dir:1}),[l,u]=H(0),[d,f]=H(600),p=ve(null),m=()=>q.volumes().then(e=>n(e.items),i);U(()=>{m()},[]),U(()=>{p.current&&f(p.current.clientHeight)},[t]);let h=ye(()=>{if(!t)return[];let e=a.trim().toLowerCase(),n=Ve.find(e=>e.key===s.key);return(e?t.filter(t=>t.name.toLowerCase().includes(e)||Re(t.labels).toLowerCase().includes(e)):t.slice()).sort((e,t)=>{let r=n.value(e),i=n.value(t);return(r<i?-1:+(r>i))*s.dir})},[t,a,s]);if(r)return J`<${Y} error=${r} />`;if(!t)return J`<p class="loading">Loading…</p>`;let g=Math.max(0,Math.floor(l/$)-Be),_=Math.min(h.length,Math.ceil((l+d)/$)+Be),v=e=>c(s.key===e?{key:e,dir:-s.dir}:{key:e,dir:1});return J`<section class="volumes">
    <div class="toolbar">
      <h2>Volumes</h2>
      <input
        type="search"
        name="search"
        placeholder="Search by name or label"
        value=${a}
        onInput=${e=>{o(e.target.value),u(0),p.current&&(p.current.scrollTop=0)}}
      />
      <span class="count" data-count=${h.length}>${h.length} of ${t.length}</span>
      ${e&&J`<${X}
        id="create-volume"
        label="Create volume"
        title="Create a volume"
        fields=${[{name:`name`,label:`Name`,placeholder:`web01`},{name:`size`,label:`Root disk size (GiB, or 512M)`,initial:`10`},{name:`disks`,label:`Disks`,initial:`1`,options:[`1`,`2`,`3`,`4`]}]}
        confirm=${e=>`Create volume "${e.name}" with ${e.disks} disk(s) of ${e.size}?`}
        run=${e=>{let t=Le(e.size),n=parseInt(e.disks,10)||1,r=[];for(let e=0;e<n;e++)r.push({name:e===0?`root`:`data`+e,size:t});return q.createVolume({name:e.name.trim(),capacity:t*n,disks:r})}}
        done=${e=>{location.hash=`#/volumes/`+encodeURIComponent(e.name)}}
      />`}
    </div>
    <div class="vlist" role="table">
      <div class="row head" role="row">
        ${Ve.map(e=>J`<div role="columnheader" class=${`c-`+e.key} data-sort=${e.key} onClick=${()=>v(e.key)}>
            ${e.label}${s.key===e.key?s.dir>0?` ▲`:` ▼`:``}
          </div>`)}
      </div>
      <div class="body" ref=${p} onScroll=${e=>u(e.target.scrollTop)}>
        <div style=${{height:h.length*$+`px`,position:`relative`}}>
          ${h.slice(g,_).map((e,t)=>J`<a
              class="row"
              role="row"
              data-volume=${e.name}
              href=${`#/volumes/`+encodeURIComponent(e.name)}
              style=${{top:(g+t)*$+`px`}}
            >
              ${Ve.map(t=>J`<div role="cell" class=${`c-`+t.key}>${t.show?t.show(e):t.value(e)}</div>`)}
            </a>`)}
        </div>
      </div>
    </div>
  </section>`}function We({name:e,canWrite:t}){let[n,r]=H(null),[i,a]=H([]),[o,s]=H([]),[c,l]=H(null),[u,d]=H(``),f=()=>{q.volume(e).then(r,l),q.snapshots(e).then(e=>a(e.items||[]),()=>a([])),q.attachments(e).then(e=>s(e.items||[]),()=>s([]))};U(f,[e]);let p=e=>()=>{d(e),f()};if(c)return J`<p><a href="#/volumes">← Volumes</a></p><${Y} error=${c} />`;if(!n)return J`<p class="loading">Loading…</p>`;if(n.state===`broken`)return J`<section><h2>${n.name}</h2><div class="error" role="alert">Quarantined: ${n.reason}</div></section>`;let m=o.find(e=>e.writer);return J`<section class="volume" data-volume-page=${n.name}>
    <p><a href="#/volumes">← Volumes</a></p>
    <div class="toolbar">
      <h2>${n.name}</h2>
      ${t&&J`<div class="actions">
        <${X}
          id="snapshot"
          label="Snapshot"
          title=${`Snapshot every disk of `+n.name}
          fields=${[{name:`name`,label:`Snapshot name`,placeholder:`nightly`}]}
          confirm="One crash-consistent snapshot of all the volume's disks at one instant."
          run=${e=>q.createSnapshot(n.name,e.name.trim())}
          done=${e=>p(`Snapshot ${e.name} taken.`)()}
        />
        <${X}
          id="clone"
          label="Clone"
          title=${`Clone `+n.name+` (live)`}
          fields=${[{name:`names`,label:`New volume name(s), comma-separated`,placeholder:`web02`}]}
          confirm="Clones the live volume through an implicit snapshot."
          run=${e=>q.clone({volume:n.name},Ge(e.names))}
          done=${e=>p(`Cloned to ${e.items.map(e=>e.name).join(`, `)}.`)()}
        />
        <${X}
          id="delete-volume"
          danger
          label="Delete"
          title=${`Delete `+n.name}
          fields=${[{name:`recursive`,label:`Delete its snapshots too`,type:`checkbox`,initial:n.snapshots>0}]}
          confirm=${`Delete volume "${n.name}" and all its disks? This cannot be undone.`}
          run=${e=>q.deleteVolume(n.name,e.recursive)}
          done=${()=>{location.hash=`#/volumes`}}
        />
      </div>`}
    </div>
    ${u&&J`<div class="notice" role="status">${u}</div>`}
    <dl class="facts">
      <dt>Capacity</dt><dd>${Z(n.capacity)}</dd>
      <dt>Created</dt><dd>${Q(n.createdAt)}</dd>
      ${n.tenant&&J`<dt>Tenant</dt><dd>${n.tenant}</dd>`}
      <dt>Labels</dt><dd>${Re(n.labels)||`—`}</dd>
      ${n.source&&J`<dt>Cloned from</dt>
        <dd data-source>
          <a href=${`#/volumes/`+encodeURIComponent(n.source.volume)}>${n.source.volume}</a>
          ${n.source.snapshot?`@`+n.source.snapshot:` (live)`}
        </dd>`}
      <dt>Writer</dt>
      <dd>${m?`${m.node} (epoch ${n.writer&&n.writer.epoch})`:`none connected`}</dd>
      ${n.qos&&J`<dt>QoS</dt><dd>${Ke(n.qos)}</dd>`}
      ${n.replicas>1&&J`<dt>Copies</dt><dd>${(n.copies||[]).map(e=>`${e.node}: ${e.state}`).join(`, `)}</dd>`}
    </dl>

    <h3>Disks</h3>
    <table class="grid" data-table="disks">
      <thead><tr><th>Name</th><th>Size</th><th>Allocated</th><th>Shared</th></tr></thead>
      <tbody>
        ${(n.disks||[]).map(e=>J`<tr data-disk=${e.name}>
            <td>${e.name}</td><td>${Z(e.size)}</td><td>${Z(e.allocated)}</td><td>${e.shared?`yes`:``}</td>
          </tr>`)}
      </tbody>
    </table>

    <h3>Snapshots</h3>
    ${i.length===0?J`<p class="dim">No snapshots.</p>`:J`<table class="grid" data-table="snapshots">
          <thead><tr><th>Name</th><th>Taken</th><th>Method</th><th>Disks</th>${t&&J`<th></th>`}</tr></thead>
          <tbody>
            ${i.map(e=>J`<tr data-snapshot=${e.name}>
                <td>${e.name}</td>
                <td>${Q(e.createdAt)}</td>
                <td>${e.method}</td>
                <td>${(e.disks||[]).map(e=>e.name).join(`, `)}</td>
                ${t&&J`<td class="actions">
                  <${X}
                    id=${`clone-snapshot-`+e.name}
                    label="Clone"
                    title=${`Clone ${n.name}@${e.name}`}
                    fields=${[{name:`names`,label:`New volume name(s), comma-separated`}]}
                    run=${t=>q.clone({volume:n.name,snapshot:e.name},Ge(t.names))}
                    done=${e=>p(`Cloned to ${e.items.map(e=>e.name).join(`, `)}.`)()}
                  />
                  <${X}
                    id=${`rollback-`+e.name}
                    danger
                    label="Rollback"
                    title=${`Roll ${n.name} back to ${e.name}`}
                    confirm=${`Every disk of ${n.name} returns to snapshot ${e.name}; later writes are lost. The server refuses while a writer is connected.`}
                    run=${()=>q.rollback(n.name,e.name)}
                    done=${p(`Rolled back to ${e.name}.`)}
                  />
                  <${X}
                    id=${`delete-snapshot-`+e.name}
                    danger
                    label="Delete"
                    title=${`Delete snapshot ${e.name}`}
                    confirm=${`Delete snapshot ${n.name}@${e.name}?`}
                    run=${()=>q.deleteSnapshot(n.name,e.name)}
                    done=${p(`Snapshot ${e.name} deleted.`)}
                  />
                </td>`}
              </tr>`)}
          </tbody>
        </table>`}

    <h3>Attachments</h3>
    ${o.length===0?J`<p class="dim">Not attached.</p>`:J`<table class="grid" data-table="attachments">
          <thead><tr><th>Node</th><th>Mode</th><th>State</th><th>Connections</th><th>Since</th></tr></thead>
          <tbody>
            ${o.map(e=>J`<tr data-attachment=${e.id}>
                <td>${e.node}${e.implicit?` (implicit)`:``}</td>
                <td>${e.mode}</td>
                <td class=${e.state===`fenced`?`bad`:e.state===`writer`?`ok`:``}>${e.state}</td>
                <td>${e.connections}</td>
                <td>${Q(e.createdAt)}</td>
              </tr>`)}
          </tbody>
        </table>`}
  </section>`}function Ge(e){return e.split(/[\s,]+/).map(e=>e.trim()).filter(Boolean)}function Ke(e){return Object.entries(e).map(([e,t])=>`${e} ${t}`).join(`, `)}var qe=new Set([`admin`,`tenant`]);function Je(){let[e,t]=H(location.hash);return U(()=>{let e=()=>t(location.hash);return addEventListener(`hashchange`,e),()=>removeEventListener(`hashchange`,e)},[]),e}function Ye({onLogin:e,error:t}){let[n,r]=H(``),[i,a]=H(t),[o,s]=H(!1);return J`<form class="login" onSubmit=${async t=>{t.preventDefault(),s(!0),a(null);try{let t=await q.whoami(n.trim());ke(n.trim()),e(t)}catch(e){a(e)}finally{s(!1)}}}>
    <h1>quiver</h1>
    <label>
      API token
      <input type="password" name="token" autocomplete="off" value=${n} onInput=${e=>r(e.target.value)} />
    </label>
    <p class="dim">The token stays in this tab (sessionStorage) and goes only to this server's API.</p>
    <${Y} error=${i} />
    <button class="primary" type="submit" disabled=${o}>Sign in</button>
  </form>`}function Xe(){let e=Je(),[t,n]=H(void 0);if(U(()=>{let e=Oe();e===null?n(null):q.whoami(e).then(n,()=>{ke(null),n(null)})},[]),t===void 0)return J`<p class="loading">Loading…</p>`;if(t===null)return J`<${Ye} onLogin=${n} />`;let r=qe.has(t.role),i=()=>{ke(null),n(null),location.hash=``},a,o=/^#\/volumes\/(.+)$/.exec(e);a=o?J`<${We} key=${o[1]} name=${decodeURIComponent(o[1])} canWrite=${r} />`:e===`#/volumes`?J`<${Ue} canWrite=${r} />`:J`<${ze} />`;let s=(e,t,n)=>J`<a href=${e} class=${n?`on`:``}>${t}</a>`;return J`<div class="app">
    <header>
      <span class="brand">quiver</span>
      <nav>
        ${s(`#/`,`Overview`,!e.startsWith(`#/volumes`))} ${s(`#/volumes`,`Volumes`,e.startsWith(`#/volumes`))}
      </nav>
      <span class="me" data-role=${t.role}>
        ${t.role}${t.tenant?` of `+t.tenant:``}${t.tokenID?` · `+t.tokenID:``}
      </span>
      <button onClick=${i}>Sign out</button>
    </header>
    <main>${a}</main>
  </div>`}L(J`<${Xe} />`,document.getElementById(`app`));